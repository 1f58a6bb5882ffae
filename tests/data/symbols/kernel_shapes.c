/* Fixture for the PDB reader tests: C structures shaped like the kernel's (nested
   structures, anonymous unions, bit fields, arrays, enums, function pointers), a
   static function only the PDB names, and exports.  Built at test time with
   clang --target=*-pc-windows-msvc -gcodeview and lld-link /debug (tests/symbols_support.py). */
typedef unsigned long long ULONG64;
typedef unsigned long ULONG;
typedef unsigned short USHORT;
typedef unsigned char UCHAR;
typedef struct _LIST_ENTRY { struct _LIST_ENTRY *Flink; struct _LIST_ENTRY *Blink; } LIST_ENTRY;
typedef enum _KTHREAD_STATE { Initialized = 0, Ready = 1, Running = 2, Waiting = 5 } KTHREAD_STATE;
struct _KPROCESS;
typedef struct _DISPATCHER_HEADER {
    union {
        volatile long Lock;
        struct { UCHAR Type; UCHAR Signalling; UCHAR Size; UCHAR Reserved1; };
    };
    long SignalState;
    LIST_ENTRY WaitListHead;
} DISPATCHER_HEADER;
typedef struct _KTHREAD {
    DISPATCHER_HEADER Header;
    void *SListFaultAddress;
    ULONG64 QuantumTarget;
    void *InitialStack;
    void * volatile StackLimit;
    void *StackBase;
    ULONG64 ThreadLock;
    union {
        struct {
            ULONG AutoBoostActive : 1;
            ULONG ReadyTransition : 1;
            ULONG WaitNext : 1;
            ULONG Reserved : 29;
        };
        long MiscFlags;
    };
    const KTHREAD_STATE State;
    UCHAR WaitReason;
    char Name[16];
    ULONG Counters[4][2];
    struct _KPROCESS *Process;
    LIST_ENTRY ThreadListEntry;
    int (*Callback)(void *Context, ULONG Flags);
} KTHREAD, *PKTHREAD;
struct _KPROCESS { DISPATCHER_HEADER Header; LIST_ENTRY ThreadListHead; KTHREAD *FirstThread; };

__declspec(dllexport) KTHREAD SampleThread;
static int HiddenCounter;
int GlobalCounter = 7;

static int __declspec(noinline) CopyLeaf(char *dst, const char *src, int n) {
    volatile char buf[64];
    int i;
    for (i = 0; i < n && i < 64; i++) buf[i] = src[i];
    for (i = 0; i < n && i < 64; i++) dst[i] = buf[i];
    HiddenCounter += n;
    return n;
}
int __declspec(noinline) CopyMiddle(char *dst, const char *src, int n) { char tmp[128]; CopyLeaf(tmp, src, n); return CopyLeaf(dst, tmp, n); }
__declspec(dllexport) int ExportedEntry(char *dst, const char *src, int n) { return CopyMiddle(dst, src, n) + SampleThread.WaitReason; }
__declspec(dllexport) unsigned long ThreadState(PKTHREAD t) { return t->State + t->AutoBoostActive + t->Process->Header.Size; }
int _DllMainCRTStartup(void *h, unsigned long r, void *p) { return 1; }
