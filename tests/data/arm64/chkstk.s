// __chkstk for the tests (no Windows SDK): Windows' convention takes the frame
// size / 16 in x15 and leaves x15 unchanged; probing pages is irrelevant here.
    .text
    .globl __chkstk
    .p2align 2
__chkstk:
    ret
