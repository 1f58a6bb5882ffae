/* Frame shapes for the stackuse estimator.  Built at test time with MinGW-w64
 * (x64 and x86, -O0 and -O2, -fstack-usage) into a DLL exporting every function;
 * gcc's .su file is the ground truth for each frame.  NOIPA keeps gcc from
 * inlining or specialising across functions, so every call stays a real call. */
#include <stddef.h>
#include <malloc.h>
#include <windows.h>

#define NOIPA __attribute__((noinline, noipa))

NOIPA void sink(volatile char *buffer, size_t size) { buffer[0] = (char)size; }

NOIPA int leaf_add(int a, int b) { return a + b; }

NOIPA int small_locals(int seed)
{
    volatile char buffer[64];
    sink(buffer, sizeof buffer);
    return buffer[seed & 63];
}

NOIPA int medium_locals(int seed)
{
    volatile char buffer[600];
    sink(buffer, sizeof buffer);
    return buffer[seed % 600] + small_locals(seed);
}

/* Larger than a page: the compiler probes the stack through __chkstk. */
NOIPA int big_locals(int seed)
{
    volatile char buffer[9000];
    sink(buffer, sizeof buffer);
    return buffer[seed % 9000] + medium_locals(seed);
}

/* Keeps many values live across calls: callee-saved registers get pushed/saved. */
NOIPA int many_saves(int a, int b, int c, int d)
{
    int e = leaf_add(a, b), f = leaf_add(b, c), g = leaf_add(c, d), h = leaf_add(d, a);
    int i = leaf_add(e, f), j = leaf_add(g, h), k = leaf_add(i, j);
    return a + b + c + d + e + f + g + h + i + j + k + leaf_add(k, a);
}

/* Dynamic frames: the allocation depends on an argument. */
NOIPA int alloca_user(int n)
{
    volatile char *p = alloca((size_t)n + 1);
    sink(p, (size_t)n);
    return p[0];
}

NOIPA int vla_user(int n)
{
    volatile char buffer[n + 1];
    sink(buffer, (size_t)n);
    return buffer[0];
}

/* Recursion: no finite static bound. */
NOIPA int recursive_sum(int n)
{
    volatile char pad[32];
    sink(pad, sizeof pad);
    return n <= 0 ? 0 : n + recursive_sum(n - 1);
}

/* A three-deep chain whose worst case is checked against a hand-computed sum. */
NOIPA int chain_c(int x) { volatile char b[200]; sink(b, sizeof b); return b[x & 7]; }
NOIPA int chain_b(int x) { volatile char b[100]; sink(b, sizeof b); return chain_c(x) + b[1]; }
NOIPA int chain_a(int x) { volatile char b[50]; sink(b, sizeof b); return chain_b(x) + leaf_add(x, b[2]); }

/* At -O2 the call becomes `jmp tail_target` (a tail call). */
NOIPA int tail_target(int x) { volatile char b[128]; sink(b, sizeof b); return b[x & 3]; }
NOIPA int tail_caller(int x) { return tail_target(x + 1); }

/* Indirect call: the bound is only a lower bound. */
typedef int (*callback_t)(int);
NOIPA int indirect_caller(callback_t callback, int x) { return callback(x) + 1; }

/* Many arguments: on x86 they go on the stack at the call site. */
NOIPA int eight_args(int a, int b, int c, int d, int e, int f, int g, int h)
{
    return a + b + c + d + e + f + g + h;
}
NOIPA int calls_eight_args(int x) { return eight_args(x, x, x, x, x, x, x, x) + 1; }

/* stdcall (callee pops its arguments on x86). */
NOIPA int __stdcall stdcall_callee(int a, int b, int c) { volatile char b2[16]; sink(b2, 16); return a + b + c; }
NOIPA int calls_stdcall(int x) { return stdcall_callee(x, x, x) * 2; }

/* A call into another module through the import address table. */
NOIPA unsigned calls_import(void) { return (unsigned)GetCurrentProcessId() + 1; }

BOOL WINAPI DllMain(HINSTANCE instance, DWORD reason, LPVOID reserved)
{
    (void)instance; (void)reason; (void)reserved;
    return TRUE;
}
