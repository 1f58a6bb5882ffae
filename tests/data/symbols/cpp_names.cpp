// Fixture: C++ names (namespaces, methods, static members): publics are decorated,
// procedures and global data carry the qualified names WinDbg shows.
namespace drv { struct Queue { int depth; int Push(int v); static int count; }; int Queue::count = 3;
int __declspec(noinline) Queue::Push(int v) { depth += v; return depth + count; } }
extern "C" __declspec(dllexport) int Entry(int v) { drv::Queue q{1}; return q.Push(v); }
