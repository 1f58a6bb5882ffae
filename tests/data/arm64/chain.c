/* Code for the ARM64 unwinder and stackuse tests: built with
 * clang --target=aarch64-pc-windows-msvc and lld-link /dll /noentry, then run in
 * unicorn from `run` and stopped at random instructions.  The functions cover the
 * prologue shapes Windows' ARM64 unwind data describes: leaf functions without
 * unwind data, packed and .xdata forms, saved x19-x28 and d8-d15, frame records,
 * dynamic allocation (sp restored from fp), homed varargs, several epilogues,
 * tail calls and a frame large enough for __chkstk. */
#include <stdarg.h>

typedef unsigned long long u64;

volatile u64 sink;

__declspec(noinline) u64 leaf_mix(u64 a, u64 b) { return (a * 31) ^ (b >> 3); }

__declspec(noinline) u64 many_saved(u64 a, u64 b, u64 c, u64 d) {
    u64 r1 = leaf_mix(a, b), r2 = leaf_mix(b, c), r3 = leaf_mix(c, d), r4 = leaf_mix(d, a);
    u64 r5 = leaf_mix(r1, r2), r6 = leaf_mix(r3, r4), r7 = leaf_mix(r5, r6);
    u64 r8 = leaf_mix(r7, r1), r9 = leaf_mix(r8, r2);
    return r1 + r2 * 3 + r3 * 5 + r4 * 7 + r5 + r6 + r7 + r8 + r9;
}

__declspec(noinline) double float_saved(double x, u64 n) {
    double a = x * 1.5, b = x * 2.5, c = x * 3.5, d = x * 4.5;
    u64 m = leaf_mix(n, (u64)a);
    double e = a * b + (double)m, f = c * d - (double)leaf_mix(m, n);
    sink = leaf_mix((u64)e, (u64)f);
    return a + b + c + d + e + f;
}

__declspec(noinline) u64 big_frame(u64 n) {
    volatile u64 buffer[1200];          /* 9600 bytes: probed with __chkstk */
    buffer[n % 1200] = n;
    buffer[(n * 7) % 1200] = many_saved(n, n + 1, n + 2, n + 3);
    return buffer[n % 1200] + buffer[(n * 7) % 1200];
}

__declspec(noinline) u64 dynamic_frame(u64 n) {
    volatile u64 *block = __builtin_alloca(16 * (n % 5 + 1));
    block[0] = n;
    return leaf_mix(block[0], (u64)float_saved((double)n, n)) + big_frame(n);
}

__declspec(noinline) u64 varargs_sum(int count, ...) {
    va_list list;
    u64 total = 0;
    va_start(list, count);
    for (int i = 0; i < count; i++)
        total += leaf_mix(va_arg(list, u64), (u64)i);
    va_end(list);
    return total;
}

__declspec(noinline) u64 early_returns(u64 n) {
    if (n % 3 == 0)
        return leaf_mix(n, 1) + dynamic_frame(n);
    if (n % 3 == 1) {
        u64 x = varargs_sum(3, n, n + 1, n + 2);
        return x + leaf_mix(x, n);
    }
    return many_saved(n, 2, 3, 4) * 2 + varargs_sum(2, n, n);
}

__declspec(noinline) u64 tail_caller(u64 n) { return early_returns(n + 1); }

__declspec(noinline) u64 recurse(u64 depth, u64 n) {
    volatile u64 local[4];
    local[depth & 3] = n;
    if (depth == 0)
        return tail_caller(n) + local[0];
    return recurse(depth - 1, n * 5 + 1) + local[depth & 3];
}

__declspec(dllexport) u64 run(u64 seed) {
    u64 total = 0;
    for (u64 i = 0; i < 3; i++)
        total += recurse(2 + (seed + i) % 3, seed + i);
    return total;
}
