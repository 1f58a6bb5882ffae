# An interrupt handler's entry as the kernel writes one: the processor has pushed
# a machine frame (no error code); the handler saves RBP, allocates a frame and
# calls C.  Its unwind data says so with PUSH_MACHFRAME (.seh_pushframe, which GNU
# as and LLVM's assembler both accept without an argument).
        .text
        .globl  isr_stub
        .def    isr_stub; .scl 2; .type 32; .endef
        .seh_proc isr_stub
isr_stub:
        .seh_pushframe
        pushq   %rbp
        .seh_pushreg %rbp
        subq    $0x30, %rsp
        .seh_stackalloc 0x30
        .seh_endprologue
        callq   isr_body
        addq    $0x30, %rsp
        popq    %rbp
        iretq
        .seh_endproc
