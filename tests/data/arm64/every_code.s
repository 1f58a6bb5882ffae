// Functions whose unwind data uses every unwind code the LLVM 14 assembler can
// emit, for the decoder tests (llvm-readobj is the referee).  Not executed.
    .text

    .globl every_code
    .p2align 2
    .seh_proc every_code
every_code:
    sub sp, sp, #(1 << 20)
    .seh_stackalloc 1048576
    stp x19, x20, [sp, #-48]!
    .seh_save_r19r20_x 48
    stp x23, x24, [sp, #-32]!
    .seh_save_regp_x x23, 32
    str x25, [sp, #8]
    .seh_save_reg x25, 8
    str x26, [sp, #-16]!
    .seh_save_reg_x x26, 16
    stp x27, lr, [sp, #-16]!
    .seh_stackalloc 16
    stp x21, lr, [sp, #0]
    .seh_save_lrpair x21, 0
    stp d8, d9, [sp, #-32]!
    .seh_save_fregp_x d8, 32
    stp d10, d11, [sp, #16]
    .seh_save_fregp d10, 16
    str d12, [sp, #-16]!
    .seh_save_freg_x d12, 16
    str d13, [sp, #8]
    .seh_save_freg d13, 8
    sub sp, sp, #4080
    .seh_stackalloc 4080
    sub sp, sp, #32
    .seh_stackalloc 32
    stp x29, x30, [sp, #-16]!
    .seh_save_fplr_x 16
    stp x29, x30, [sp, #8]
    .seh_save_fplr 8
    mov x29, sp
    .seh_set_fp
    add x29, sp, #16
    .seh_add_fp 16
    nop
    .seh_nop
    .seh_endprologue
    .seh_startepilogue
    ldp x29, x30, [sp], #16
    .seh_save_fplr_x 16
    add sp, sp, #(1 << 20)
    .seh_stackalloc 1048576
    .seh_endepilogue
    ret
    .seh_endproc

    .globl paired_saves
    .p2align 2
    .seh_proc paired_saves
paired_saves:
    stp x19, x20, [sp, #-64]!
    .seh_save_regp_x x19, 64
    stp x23, x24, [sp, #16]
    .seh_save_regp x23, 16
    stp x25, x26, [sp, #32]
    .seh_save_regp x25, 32
    stp d8, d9, [sp, #48]
    .seh_save_fregp d8, 48
    .seh_endprologue
    cbz x0, 1f
    .seh_startepilogue
    ldp d8, d9, [sp, #48]
    .seh_save_fregp d8, 48
    ldp x25, x26, [sp, #32]
    .seh_save_regp x25, 32
    ldp x23, x24, [sp, #16]
    .seh_save_regp x23, 16
    ldp x19, x20, [sp], #64
    .seh_save_regp_x x19, 64
    .seh_endepilogue
    ret
1:
    mov x0, #1
    .seh_startepilogue
    ldp x19, x20, [sp], #64
    .seh_save_regp_x x19, 64
    .seh_endepilogue
    ret
    .seh_endproc

    .globl special_frames
    .p2align 2
    .seh_proc special_frames
special_frames:
    .seh_trap_frame
    .seh_pushframe
    .seh_context
    .seh_clear_unwound_to_call
    .seh_endprologue
    ret
    .seh_endproc
