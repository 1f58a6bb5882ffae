// A kernel trap handler for the walker tests.  The emulator delivers the trap on
// a function's first instruction: it stores a KTRAP_FRAME (x0-x18, sp, lr, fp,
// pc of the interrupted code) below sp, points sp at it and enters trap_stub,
// whose unwind data says so (.seh_trap_frame).  The stub calls into chain.c,
// then resumes the interrupted code from the trap frame (at a function's entry
// only x0-x8, fp, lr and sp are live).
    .text
    .globl trap_stub
    .p2align 2
    .seh_proc trap_stub
trap_stub:
    .seh_trap_frame
    stp x29, x30, [sp, #-16]!
    .seh_save_fplr_x 16
    mov x29, sp
    .seh_set_fp
    .seh_endprologue
    mov x0, #3
    bl early_returns
    .seh_startepilogue
    ldp x29, x30, [sp], #16
    .seh_save_fplr_x 16
    .seh_endepilogue
    ldp x0, x1, [sp, #0xa0]
    ldp x2, x3, [sp, #0xb0]
    ldp x4, x5, [sp, #0xc0]
    ldp x6, x7, [sp, #0xd0]
    ldr x8, [sp, #0xe0]
    ldr x29, [sp, #0x140]
    ldr x30, [sp, #0x138]
    ldr x16, [sp, #0x148]
    ldr x17, [sp, #0x98]
    mov sp, x17
    br x16
    .seh_endproc
