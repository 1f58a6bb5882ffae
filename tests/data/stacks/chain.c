/* Known call chains for the stack unwinder's tests.  The tests execute these
 * functions in an emulator, stop at chosen instructions and unwind the stack
 * the compiler's own unwind data describes. */
#define NOINLINE __attribute__((noinline))
#define EXPORT __declspec(dllexport)

volatile int sink;

int isr_stub(void);

/* A leaf: no frame of its own (clang gives it no .pdata entry). */
NOINLINE EXPORT int leaf(int x) { return x * 3 + sink; }

/* Writes one byte through a pointer: the caller's whole array must exist. */
NOINLINE EXPORT void touch(char *p) { p[0] = (char)sink; }

NOINLINE EXPORT int middle(int x)
{
    char buffer[64];
    touch(buffer);
    int result = leaf(x + buffer[0]);
    return result + buffer[1];
}

/* Keeps values in callee-saved registers across its calls. */
NOINLINE EXPORT int outer(int x)
{
    int a = middle(x);
    int b = middle(a + x);
    return a * b + x;
}

NOINLINE EXPORT int deep3(int x) { volatile int pad[4]; pad[0] = x; return leaf(x) + pad[0]; }
NOINLINE EXPORT int deep2(int x) { volatile int pad[4]; pad[0] = x; return deep3(x) + pad[0]; }
NOINLINE EXPORT int deep1(int x) { volatile int pad[4]; pad[0] = x; return deep2(x) + pad[0]; }

/* Its locals are never written below buffer[0]: they keep whatever the finished
 * deep1 -> deep2 -> deep3 -> leaf calls left there, return addresses included. */
NOINLINE EXPORT int big_locals(int x)
{
    char buffer[512];
    touch(buffer);
    return leaf(x) + buffer[0];
}

NOINLINE EXPORT int stale(int x)
{
    int a = deep1(x);
    return big_locals(a) + a;
}

/* Runs on the stack an interrupt handler (isr_stub) switched to. */
NOINLINE EXPORT int isr_body(void) { return leaf(7) + 1; }

EXPORT int entry(int x) { return outer(x) + stale(x); }

/* Ends in an indirect tail call once its saved registers are restored: clang
 * emits `add rsp, 0x28; pop rdi; pop rsi; rex.W jmp rax`, MinGW gcc `add rsp,
 * 0x28; rex.WB jmp r8` (the REX.W marks the jump as an epilogue's end). */
typedef int (*operation)(int);
operation volatile operations[2] = {leaf, middle};

NOINLINE EXPORT int tail_indirect(int x)
{
    operation f = operations[x & 1];
    int y = middle(x);
    return f(y + x);
}

EXPORT int dispatch(int x) { return tail_indirect(x) + 1; }
