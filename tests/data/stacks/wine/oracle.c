/* The Wine oracle: a program that records its own call chain and then has a
 * second thread write a minidump of it through dbghelp's MiniDumpWriteDump.
 *
 * Every function on the chain stores __builtin_return_address(0) on entry, so
 * the chain the program records is the truth the minidump's stack must unwind
 * to.  The main thread parks in a spin loop at the deepest point (its context
 * in the dump is inside park()); the dumper thread writes <name>.dmp and then
 * the recorded return addresses, one hex value a line, to <name>.chain.  With
 * the argument "fault", park() faults instead and the unhandled-exception filter
 * writes <name>-fault.dmp (with the exception and its context) and
 * <name>-fault.chain from the faulting thread.
 *
 * The functions on the chain: recursion, a frame beyond a page (a stack probe),
 * alloca, doubles kept across a call (saved XMM registers). */
#include <windows.h>
#include <dbghelp.h>
#include <malloc.h>
#include <stdio.h>
#include <string.h>

#define NOINLINE __attribute__((noinline))
#define RECORD() (chain[depth++] = __builtin_return_address(0))

static void *volatile chain[64];
static volatile int depth;
static volatile int parked, written;
static char name[MAX_PATH];
volatile int sink;

/* The recorded return addresses, innermost first (as k lists frames), to <name>.chain. */
static void write_chain(void)
{
    char path[MAX_PATH + 8];
    FILE *out;
    int index;
    snprintf(path, sizeof path, "%s.chain", name);
    out = fopen(path, "w");
    for (index = depth - 1; index >= 0; index--)
        fprintf(out, "%p\n", chain[index]);
    fclose(out);
}

static DWORD WINAPI dumper(LPVOID unused)
{
    char path[MAX_PATH + 8];
    HANDLE file;
    (void)unused;
    while (!parked)
        Sleep(1);
    snprintf(path, sizeof path, "%s.dmp", name);
    file = CreateFileA(path, GENERIC_WRITE, 0, NULL, CREATE_ALWAYS, FILE_ATTRIBUTE_NORMAL, NULL);
    if (file == INVALID_HANDLE_VALUE ||
        !MiniDumpWriteDump(GetCurrentProcess(), GetCurrentProcessId(), file, MiniDumpNormal, NULL, NULL, NULL))
        ExitProcess(2);
    CloseHandle(file);
    write_chain();
    written = 1;
    ExitProcess(0);
    return 0;
}

static int faulting;

/* The exception filter: the dump with the exception's context, written by the
 * faulting thread itself. */
static LONG WINAPI filter(EXCEPTION_POINTERS *pointers)
{
    MINIDUMP_EXCEPTION_INFORMATION exception;
    char path[MAX_PATH + 8];
    HANDLE file;
    exception.ThreadId = GetCurrentThreadId();
    exception.ExceptionPointers = pointers;
    exception.ClientPointers = FALSE;
    snprintf(path, sizeof path, "%s.dmp", name);
    file = CreateFileA(path, GENERIC_WRITE, 0, NULL, CREATE_ALWAYS, FILE_ATTRIBUTE_NORMAL, NULL);
    if (file == INVALID_HANDLE_VALUE || !MiniDumpWriteDump(GetCurrentProcess(), GetCurrentProcessId(), file,
                                                           MiniDumpNormal, &exception, NULL, NULL))
        ExitProcess(2);
    CloseHandle(file);
    write_chain();
    ExitProcess(0);
    return EXCEPTION_EXECUTE_HANDLER;
}

/* The deepest point: spins until the dumper has written the dump, or faults. */
NOINLINE void park(void)
{
    RECORD();
    if (faulting)
        *(volatile int *)(INT_PTR)sink = 1;   /* sink is 0: an access violation */
    parked = 1;
    while (!written)
        sink++;
}

/* Keeps doubles live across a call: non-volatile XMM registers saved in the prologue. */
NOINLINE double with_xmm(double a, double b)
{
    double c, d, e;
    RECORD();
    c = a * b + sink;
    d = a - b;
    e = a / (b + 1.0);
    park();
    return c + d * e + a + b;
}

/* A variable-size allocation. */
NOINLINE int with_alloca(int n)
{
    char *buffer;
    RECORD();
    buffer = alloca(n);
    memset(buffer, n, n);
    return (int)with_xmm(buffer[n - 1], n) + buffer[0];
}

/* A frame beyond a page: a stack probe in the prologue. */
NOINLINE int large_frame(int n)
{
    volatile char buffer[12000];
    RECORD();
    buffer[0] = (char)n;
    buffer[n] = (char)sink;
    return with_alloca(n + 16) + buffer[0] + buffer[n];
}

NOINLINE int recurse(int n)
{
    volatile int pad[3];
    RECORD();
    pad[0] = n;
    if (n > 0)
        return recurse(n - 1) + pad[0];
    return large_frame(100) + pad[0];
}

int main(int argc, char **argv)
{
    char *dot;
    RECORD();
    strncpy(name, argv[0], MAX_PATH - 16);
    dot = strrchr(name, '.');
    if (dot != NULL)
        *dot = 0;
    if (argc > 1 && strcmp(argv[1], "fault") == 0) {
        faulting = 1;
        strcat(name, "-fault");
        SetUnhandledExceptionFilter(filter);
    } else {
        CreateThread(NULL, 0, dumper, NULL, 0, NULL);
    }
    sink = recurse(argc + 4);
    return sink;
}
