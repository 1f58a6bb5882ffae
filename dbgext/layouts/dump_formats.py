"""Layouts of the Windows dump file structures and thread contexts.

One table per structure, shared by the dump writers (``dbgext.sample.kdump_writer``
and the tests' minidump and small-dump writers) and the dump readers
(``dbgext.target.kdump`` / ``dbgext.target.minidump``).  Because
writer and reader share these numbers, the tests cross-check every file through
independent parsers (kdmp-parser, ``minidump``) — a wrong offset here cannot hide.
Facts: shared/reference/dump-formats.md (beside the repository) (DUMP_HEADER64, _SUMMARY_DUMP64,
MINIDUMP_* from the Windows headers).  ARM64's CONTEXT and page-table bits are in
:mod:`dbgext.layouts.arm64` and :mod:`dbgext.target.arm64_paging`; the tables below
keyed by architecture name it ``"arm64"``.
"""

from .arm64 import CONTEXT_ARM64

PAGE_SIZE = 0x1000

# -- kernel crash dump ----------------------------------------------------------

# DUMP_HEADER64: offsets from the start of the file.  Unset bytes hold "PAGE".
DUMP_HEADER64 = {
    "size": 0x2000,
    "Signature": 0x000,             # b"PAGE"
    "ValidDump": 0x004,             # b"DU64" (b"DUMP" = 32-bit dump)
    "MajorVersion": 0x008,
    "MinorVersion": 0x00C,          # build number
    "DirectoryTableBase": 0x010,
    "PfnDataBase": 0x018,
    "PsLoadedModuleList": 0x020,
    "PsActiveProcessHead": 0x028,
    "MachineImageType": 0x030,
    "NumberProcessors": 0x034,
    "BugCheckCode": 0x038,
    "BugCheckParameters": 0x040,    # 4 x u64
    "VersionUser": 0x060,
    "KdDebuggerDataBlock": 0x080,
    "PhysicalMemoryBlock": 0x088,   # u32 NumberOfRuns, u32 pad, u64 NumberOfPages
    "PhysicalMemoryRuns": 0x098,    # {u64 BasePage, u64 PageCount} x NumberOfRuns
    "ContextRecord": 0x348,
    "Exception": 0xF00,             # EXCEPTION_RECORD64
    "DumpType": 0xF98,
    "RequiredDumpSpace": 0xFA0,
    "SystemTime": 0xFA8,
    "Comment": 0xFB0,
    "SystemUpTime": 0x1030,
    "MiniDumpFields": 0x1038,
    "SecondaryDataState": 0x103C,
    "ProductType": 0x1040,
    "SuiteMask": 0x1044,
    "WriterStatus": 0x1048,
    "Unused1": 0x104C,
    "KdSecondaryVersion": 0x104D,
    "Attributes": 0x1050,
    "BootId": 0x1054,
}
# DUMP_HEADER32 (x86 "PAGEDUMP"): one page; pointer fields are u32, PaeEnabled
# says how the page tables translate.  Pages follow at 0x1000 (type 1), or the
# summary header does (types 2 and 5).  Offsets as in volatility's crash vtypes
# and the Windows metadata's DUMP_HEADER32 (which total exactly 0x1000).
DUMP_HEADER32 = {
    "size": 0x1000,
    "Signature": 0x000,             # b"PAGE"
    "ValidDump": 0x004,             # b"DUMP"
    "MajorVersion": 0x008,
    "MinorVersion": 0x00C,
    "DirectoryTableBase": 0x010,
    "PfnDataBase": 0x014,
    "PsLoadedModuleList": 0x018,
    "PsActiveProcessHead": 0x01C,
    "MachineImageType": 0x020,
    "NumberProcessors": 0x024,
    "BugCheckCode": 0x028,
    "BugCheckParameters": 0x02C,    # 4 x u32
    "VersionUser": 0x03C,
    "PaeEnabled": 0x05C,            # u8
    "KdSecondaryVersion": 0x05D,
    "KdDebuggerDataBlock": 0x060,
    "PhysicalMemoryBlock": 0x064,   # u32 NumberOfRuns, u32 NumberOfPages
    "PhysicalMemoryRuns": 0x06C,    # {u32 BasePage, u32 PageCount} x NumberOfRuns
    "ContextRecord": 0x320,         # x86 CONTEXT
    "Exception": 0x7D0,             # EXCEPTION_RECORD32
    "Comment": 0x820,
    "Attributes": 0x8A0,
    "BootId": 0x8A4,
    "DumpType": 0xF88,
    "MiniDumpFields": 0xF8C,
    "SecondaryDataState": 0xF90,
    "ProductType": 0xF94,
    "SuiteMask": 0xF98,
    "WriterStatus": 0xF9C,
    "RequiredDumpSpace": 0xFA0,     # u64
    "SystemUpTime": 0xFB8,          # u64
    "SystemTime": 0xFC0,            # u64
}
MAX_PHYSICAL_RUNS_X86 = 86            # (700 - 8) / 8
X86_DUMP_TYPES = (1, 2, 5)            # full, summary and bitmap; no x86 small or RDMP dumps yet
MACHINE_I386 = 0x14C
# EXCEPTION_RECORD32: u32 Code, Flags, Record, Address, NumberParameters, Information[15].
EXCEPTION_RECORD32 = {"size": 0x50, "format": "<5I", "ExceptionInformation": 0x14}

MAX_PHYSICAL_RUNS = 42                # what fits in the 700-byte PhysicalMemoryBlock
UNSET_U32 = 0x45474150                # "PAGE" read as a u32
UNSET_U64 = 0x4547415045474150
MACHINE_AMD64 = 0x8664
MACHINE_ARM64 = 0xAA64                # same PAGEDU64 header; the CONTEXT at 0x348 is CONTEXT_ARM64
# The architecture a PAGEDU64 header's MachineImageType names (PAGEDUMP is always x86).
ARCH_OF_MACHINE64 = {MACHINE_AMD64: "x64", MACHINE_ARM64: "arm64"}

DUMP_TYPE_FULL = 1
DUMP_TYPE_SUMMARY = 2
DUMP_TYPE_TRIAGE = 4
DUMP_TYPE_BITMAP = 5
DUMP_TYPE_LIVE_BITMAP = 6
DUMP_TYPE_RDMP_KERNEL = 8             # .dump /k on new dbgeng
DUMP_TYPE_RDMP_KERNEL_USER = 9        # .dump /ka
DUMP_TYPE_RDMP_COMPLETE = 10          # .dump /f
DUMP_KIND = {
    DUMP_TYPE_FULL: "kernel-dump",
    DUMP_TYPE_SUMMARY: "kernel-summary-dump",
    DUMP_TYPE_TRIAGE: "kernel-small-dump",
    DUMP_TYPE_BITMAP: "kernel-bitmap-dump",
    DUMP_TYPE_LIVE_BITMAP: "live-kernel-dump",
    DUMP_TYPE_RDMP_KERNEL: "kernel-memory-dump",
    DUMP_TYPE_RDMP_KERNEL_USER: "kernel-and-user-memory-dump",
    DUMP_TYPE_RDMP_COMPLETE: "complete-memory-dump",
}
# What each type holds, in WinDbg's words, for ``dumpinfo``.
DUMP_TYPE_DESCRIPTION = {
    DUMP_TYPE_FULL: "complete memory dump (physical memory runs)",
    DUMP_TYPE_SUMMARY: "kernel summary dump (page bitmap, 32-bit summary header)",
    DUMP_TYPE_TRIAGE: "small memory dump (triage dump: header context, stack, selected blocks)",
    DUMP_TYPE_BITMAP: "kernel bitmap dump (page bitmap)",
    DUMP_TYPE_LIVE_BITMAP: "live kernel dump (page bitmap)",
    DUMP_TYPE_RDMP_KERNEL: "kernel memory dump (RDMP page ranges)",
    DUMP_TYPE_RDMP_KERNEL_USER: "kernel and user memory dump (RDMP page ranges)",
    DUMP_TYPE_RDMP_COMPLETE: "complete memory dump (RDMP page ranges)",
}

# _SUMMARY_DUMP64 (bitmap dumps), offsets from file offset 0x2000.
SUMMARY_DUMP64 = {
    "offset": 0x2000,
    "Signature": 0x00,              # b"SDMP" (kernel bitmap) or b"FDMP" (full bitmap)
    "ValidDump": 0x04,              # b"DUMP"
    "FirstPage": 0x20,              # absolute file offset of the first page
    "TotalPresentPages": 0x28,
    "Pages": 0x30,                  # number of bits, one per PFN
    "Bitmap": 0x38,
}

# SUMMARY_DUMP64 of the older summary dump (DumpType 2), offsets from the end of
# the dump header (0x2000 on x64, 0x1000 on x86): u32 fields, then an RTL_BITMAP
# (u32 SizeOfBitMap, then the Buffer pointer) whose bits follow; the same
# page-per-set-bit scheme as the bitmap dump.  The kernel writes its in-memory
# RTL_BITMAP as it is, so with natural alignment the pointer sits at +0x20 on
# x64 and the bits start at +0x28; on x86 the pointer is at +0x1C and the bits at
# +0x20 (ntiodump.h; dump-formats.md §1.3a, the end).  No real type-2 file was at
# hand to confirm this: these follow the sources.
SUMMARY_DUMP_OLD = {
    "offset": 0x2000,
    "Signature": 0x00,              # b"SDMP" ('PMDS' read as a u32)
    "ValidDump": 0x04,              # b"DUMP"
    "DumpOptions": 0x08,
    "HeaderSize": 0x0C,             # file offset of the first page
    "BitmapSize": 0x10,             # number of bits, one per PFN
    "Pages": 0x14,                  # pages present
    "SizeOfBitMap": 0x18,
    "Bitmap": 0x28,                 # x64
    "BitmapX86": 0x20,
}


def old_summary_layout(arch):
    """SUMMARY_DUMP_OLD with ``Bitmap`` where ``arch`` ("x64" or "x86") puts the bits."""
    return SUMMARY_DUMP_OLD if arch == "x64" else dict(SUMMARY_DUMP_OLD, Bitmap=SUMMARY_DUMP_OLD["BitmapX86"])

# RDMP dumps (DumpType 8, 9, 10), offsets from file offset 0x2000: a 0x20-byte
# header, 16 bytes (type 10: u32 NumberOfRanges, u16, u16, u64 TotalNumberOfPages),
# then {u64 PFN, u64 page count} ranges ended by a PFN of 0 or by the first page.
# kdmp-parser requires MetadataSize - 0x20 == FirstPageOffset - 0x2040.
RDMP_HEADER64 = {
    "offset": 0x2000,
    "Marker": 0x00,                 # 0x40
    "Signature": 0x04,              # b"RDMP"
    "ValidDump": 0x08,              # b"DUMP"
    "MetadataSize": 0x10,
    "FirstPageOffset": 0x18,
    "NumberOfRanges": 0x20,         # type 10 only
    "TotalNumberOfPages": 0x28,     # type 10 only
    "Ranges": 0x30,
}
RDMP_MARKER = 0x40

# TRIAGE_DUMP64 (small dumps, DumpType 4), offsets from file offset 0x2000.  Every
# ...Offset field is a file offset, every ...Size a byte count.
TRIAGE_DUMP64 = {
    "offset": 0x2000,
    "size": 0x80,
    "ServicePackBuild": 0x00,
    "SizeOfDump": 0x04,
    "ValidOffset": 0x08,            # u32 "DGRT" ends the dump
    "ContextOffset": 0x0C,
    "ExceptionOffset": 0x10,
    "MmOffset": 0x14,
    "UnloadedDriversOffset": 0x18,
    "PrcbOffset": 0x1C,
    "ProcessOffset": 0x20,
    "ThreadOffset": 0x24,
    "CallStackOffset": 0x28,
    "SizeOfCallStack": 0x2C,
    "DriverListOffset": 0x30,
    "DriverCount": 0x34,
    "StringPoolOffset": 0x38,
    "StringPoolSize": 0x3C,
    "BrokenDriverOffset": 0x40,
    "TriageOptions": 0x44,
    "TopOfStack": 0x48,             # u64: the stack pointer; the copy runs from it upward
    "ArchitectureSpecific": 0x50,
    "DataPageAddress": 0x60,        # u64
    "DataPageOffset": 0x68,
    "DataPageSize": 0x6C,
    "DebuggerDataOffset": 0x70,
    "DebuggerDataSize": 0x74,
    "DataBlocksOffset": 0x78,
    "DataBlocksCount": 0x7C,
}
TRIAGE_FORMAT = "<18IQ16sQ6I"       # the whole TRIAGE_DUMP64 in field order
TRIAGE_VALID = b"TRGD"              # 'DGRT' read as a u32
TRIAGE_OPTION_OVERFLOWED = 0x100     # data was dropped to fit, unless TriageOptions is all ones
TRIAGE_OPTIONS_ALL = 0xFFFFFFFF      # what real writers store: "every option", not a set of flags
TRIAGE_BASIC_FIELDS = 0xFF           # MiniDumpFields context..broken driver: needed before any optional part
# TRIAGE_DATA_BLOCK: u64 Address, u32 Offset (file), u32 Size.
TRIAGE_DATA_BLOCK = "<QII"
TRIAGE_DATA_BLOCK_SIZE = 16
# DUMP_DRIVER_ENTRY64: u32 DriverNameOffset (file offset of a DUMP_STRING), pad,
# then a 0x88-byte KLDR_DATA_TABLE_ENTRY.
DUMP_DRIVER_ENTRY64 = {
    "size": 0x90,
    "DriverNameOffset": 0x00,
    "DllBase": 0x08 + 0x30,
    "SizeOfImage": 0x08 + 0x40,
    "FullDllName": 0x08 + 0x48,
    "BaseDllName": 0x08 + 0x58,
    "CheckSum": 0x08 + 0x78,
    "TimeDateStamp": 0x08 + 0x80,
}
# DUMP_UNLOADED_DRIVERS64: UNICODE_STRING64 Name, WCHAR DriverName[12], u64
# StartAddress, u64 EndAddress.  A u32 count in a u64 slot precedes the entries.
DUMP_UNLOADED_DRIVERS64 = {
    "Entries": 0x08,
    "size": 0x10 + 24 + 16,
    "Name": 0x00,
    "DriverName": 0x10,
    "DriverNameChars": 12,
    "StartAddress": 0x28,
    "EndAddress": 0x30,
}
# DUMP_MM_STORAGE64: six u32 then seven u64.
DUMP_MM_STORAGE64 = {
    "format": "<6I7Q",
    "fields": ("Version", "Size", "MmSpecialPoolTag", "MiTriageActionTaken", "MmVerifyDriverLevel",
               "KernelVerifier", "MmMaximumNonPagedPool", "MmAllocatedNonPagedPool", "PagedPoolMaximum",
               "PagedPoolAllocated", "CommittedPages", "CommittedPagesPeak", "CommitLimitMaximum"),
}
# Secondary data after a small dump's SizeOfDump (ntiodump.h): DUMP_BLOB_FILE_HEADER
# {"DumpBlob", u32 HeaderSize, u32 BuildNumber}, then records of DUMP_BLOB_HEADER
# {u32 HeaderSize, GUID Tag, u32 DataSize, u32 PrePad, u32 PostPad}, each followed
# by PrePad bytes, its data and PostPad bytes.
DUMP_BLOB_FILE_HEADER = {"size": 0x10, "signature": b"DumpBlob", "HeaderSize": 0x08, "BuildNumber": 0x0C}
DUMP_BLOB_HEADER = {"size": 0x20, "format": "<I16sIII"}
# MiniDumpFields (header 0x1038) bits: which parts a small dump holds.
MINIDUMP_FIELDS = (
    (0x1, "context"), (0x2, "exception"), (0x4, "prcb"), (0x8, "process"), (0x10, "thread"),
    (0x20, "stack"), (0x40, "driver_list"), (0x80, "broken_driver"), (0x100, "mm_info"),
    (0x200, "data_page"), (0x400, "debugger_data"), (0x800, "data_blocks"),
)

# KDDEBUGGER_DATA64 (wdbgexts.h): DBGKD_DEBUG_DATA_HEADER64 {LIST_ENTRY64, u32
# OwnerTag "KDBG", u32 Size}, then pointers and the structure offsets the kernel
# publishes for debuggers.  Fields past Header.Size are absent (older builds).
KDDEBUGGER_DATA64 = {
    "OwnerTag": (0x10, "I"), "Size": (0x14, "I"),
    "KernBase": (0x18, "Q"),
    "PsLoadedModuleList": (0x48, "Q"),
    "PsActiveProcessHead": (0x50, "Q"),
    "PspCidTable": (0x58, "Q"),
    "MmPfnDatabase": (0xC0, "Q"),
    "MmHighestPhysicalPage": (0xF0, "Q"),
    "MmNumberOfPhysicalPages": (0xF8, "Q"),
    "MmSystemRangeStart": (0x1D0, "Q"),
    "MmLoadedUserImageList": (0x200, "Q"),
    "NtBuildLab": (0x208, "Q"),
    "KiProcessorBlock": (0x218, "Q"),
    "MmUnloadedDrivers": (0x220, "Q"),
    "MmLastUnloadedDriver": (0x228, "Q"),
    "OffsetKThreadNextProcessor": (0x298, "H"),
    "OffsetKThreadTeb": (0x29A, "H"),
    "OffsetKThreadKernelStack": (0x29C, "H"),
    "OffsetKThreadInitialStack": (0x29E, "H"),
    "OffsetKThreadApcProcess": (0x2A0, "H"),
    "OffsetKThreadState": (0x2A2, "H"),
    "SizeEProcess": (0x2A8, "H"),
    "OffsetEprocessPeb": (0x2AA, "H"),
    "OffsetEprocessParentCID": (0x2AC, "H"),
    "OffsetEprocessDirectoryTableBase": (0x2AE, "H"),
    "SizePrcb": (0x2B0, "H"),
    "OffsetPrcbDpcRoutine": (0x2B2, "H"),
    "OffsetPrcbCurrentThread": (0x2B4, "H"),
    "OffsetPrcbMhz": (0x2B6, "H"),
    "OffsetPrcbCpuType": (0x2B8, "H"),
    "OffsetPrcbVendorString": (0x2BA, "H"),
    "OffsetPrcbProcStateContext": (0x2BC, "H"),
    "OffsetPrcbNumber": (0x2BE, "H"),
    "SizeEThread": (0x2C0, "H"),
    "KeLoaderBlock": (0x2D8, "Q"),
    "SizePcr": (0x2E0, "H"),
    "OffsetPcrSelfPcr": (0x2E2, "H"),
    "OffsetPcrCurrentPrcb": (0x2E4, "H"),
    "OffsetPcrContainedPrcb": (0x2E6, "H"),
    "OffsetPcrInitialStack": (0x2EC, "H"),
    "OffsetPcrStackLimit": (0x2EE, "H"),
    "OffsetPrcbContext": (0x338, "H"),
    "OffsetKThreadStackLimit": (0x340, "I"),
    "OffsetKThreadStackBase": (0x344, "I"),
    "OffsetKThreadQueueListEntry": (0x348, "I"),
    "OffsetEThreadIrpList": (0x34C, "I"),
    "OffsetPrcbIdleThread": (0x350, "H"),
    "OffsetPrcbDpcStack": (0x354, "H"),
    "OffsetPrcbIsrStack": (0x356, "H"),
    "OffsetKThreadWaitReason": (0x35C, "H"),
    "PteBase": (0x360, "Q"),
}
KDBG_OWNER_TAG = b"KDBG"
KDDEBUGGER_DATA64_MAX_SIZE = 0x1000   # the block is ~0x380 bytes; more is corruption
# Which KDDEBUGGER_DATA64 offsets describe which kernel structure, under the
# structure's field names (what lookup_layout asks for), and its size field.
KDDEBUGGER_LAYOUTS = {
    "_KTHREAD": {"size": None, "fields": {
        "NextProcessor": "OffsetKThreadNextProcessor", "Teb": "OffsetKThreadTeb",
        "KernelStack": "OffsetKThreadKernelStack", "InitialStack": "OffsetKThreadInitialStack",
        "ApcState.Process": "OffsetKThreadApcProcess", "State": "OffsetKThreadState",
        "StackLimit": "OffsetKThreadStackLimit", "StackBase": "OffsetKThreadStackBase",
        "QueueListEntry": "OffsetKThreadQueueListEntry", "WaitReason": "OffsetKThreadWaitReason"}},
    "_ETHREAD": {"size": "SizeEThread", "fields": {
        "Tcb.NextProcessor": "OffsetKThreadNextProcessor", "Tcb.Teb": "OffsetKThreadTeb",
        "Tcb.KernelStack": "OffsetKThreadKernelStack", "Tcb.InitialStack": "OffsetKThreadInitialStack",
        "Tcb.StackLimit": "OffsetKThreadStackLimit", "Tcb.StackBase": "OffsetKThreadStackBase",
        "IrpList": "OffsetEThreadIrpList"}},
    "_EPROCESS": {"size": "SizeEProcess", "fields": {
        "Peb": "OffsetEprocessPeb", "InheritedFromUniqueProcessId": "OffsetEprocessParentCID",
        "Pcb.DirectoryTableBase": "OffsetEprocessDirectoryTableBase"}},
    "_KPRCB": {"size": "SizePrcb", "fields": {
        "CurrentThread": "OffsetPrcbCurrentThread", "IdleThread": "OffsetPrcbIdleThread",
        "Number": "OffsetPrcbNumber", "MHz": "OffsetPrcbMhz", "CpuType": "OffsetPrcbCpuType",
        "VendorString": "OffsetPrcbVendorString", "ProcessorState": "OffsetPrcbProcStateContext",
        "Context": "OffsetPrcbContext", "DpcStack": "OffsetPrcbDpcStack", "IsrStack": "OffsetPrcbIsrStack"}},
    "_KPCR": {"size": "SizePcr", "fields": {
        "Self": "OffsetPcrSelfPcr", "CurrentPrcb": "OffsetPcrCurrentPrcb", "Prcb": "OffsetPcrContainedPrcb"}},
}

# EXCEPTION_RECORD64 (kernel header) and MINIDUMP_EXCEPTION share this layout.
EXCEPTION_RECORD64 = {
    "size": 0x98,
    "ExceptionCode": 0x00,
    "ExceptionFlags": 0x04,
    "ExceptionRecord": 0x08,
    "ExceptionAddress": 0x10,
    "NumberParameters": 0x18,
    "ExceptionInformation": 0x20,   # 15 x u64
}

# x64 paging: 4-level tables, 512 entries each.
PTE_PRESENT = 0x1
PTE_WRITE = 0x2
PTE_USER = 0x4
PTE_ACCESSED = 0x20
PTE_DIRTY = 0x40
PTE_LARGE = 0x80                      # PS bit in a PDPTE (1 GiB) or PDE (2 MiB)
PTE_PROTOTYPE = 0x400                 # Windows software bits of a not-present PTE
PTE_TRANSITION = 0x800
PTE_PFN_MASK = 0x000FFFFFFFFFF000
# Reserved bits the processor checks in large-page entries (a set one faults).
LARGE_2M_RESERVED = 0x1FE000
LARGE_1G_RESERVED = 0x3FFFE000

# How each paging mode walks: from the top level down, (VA shift, entries per
# table); the entry size; the frame bits; which levels may map a large page
# ({level index: (page size, reserved bits)}) and at which a PS bit is reserved.
PAGING = {
    "x64": {"levels": ((39, 512), (30, 512), (21, 512), (12, 512)), "entry": "Q",
            "pfn_mask": PTE_PFN_MASK, "large": {1: (1 << 30, LARGE_1G_RESERVED), 2: (1 << 21, LARGE_2M_RESERVED)},
            "ps_reserved": (0,)},
    # PAE: CR3 names a 32-byte PDPT of four entries, not a page.
    "x86-pae": {"levels": ((30, 4), (21, 512), (12, 512)), "entry": "Q",
                "pfn_mask": PTE_PFN_MASK, "large": {1: (1 << 21, LARGE_2M_RESERVED)}, "ps_reserved": (0,)},
    "x86": {"levels": ((22, 1024), (12, 1024)), "entry": "I",
            "pfn_mask": 0xFFFFF000, "large": {0: (1 << 22, 0)}, "ps_reserved": ()},
    # ARM64 (Windows on ARM: 4 KiB granule, 48-bit VA): the x64 shape, but descriptors
    # say "table or block" with bit 1 (dbgext.target.arm64_paging decodes them), so the
    # entry bits above are not used; blocks are 1 GiB (level 1) and 2 MiB (level 2).
    "arm64": {"levels": ((39, 512), (30, 512), (21, 512), (12, 512)), "entry": "Q",
              "pfn_mask": 0x0000FFFFFFFFF000, "large": {1: (1 << 30, 0), 2: (1 << 21, 0)}, "ps_reserved": (0,),
              "descriptors": "arm64"},
}

# _KLDR_DATA_TABLE_ENTRY (x64), the entries of nt!PsLoadedModuleList.
KLDR_DATA_TABLE_ENTRY_X64 = {
    "size": 0xA0,
    "InLoadOrderLinks": 0x00,
    "DllBase": 0x30,
    "EntryPoint": 0x38,
    "SizeOfImage": 0x40,
    "FullDllName": 0x48,
    "BaseDllName": 0x58,
}

# _KLDR_DATA_TABLE_ENTRY (x86).
KLDR_DATA_TABLE_ENTRY_X86 = {
    "size": 0x50,
    "InLoadOrderLinks": 0x00,
    "DllBase": 0x18,
    "EntryPoint": 0x1C,
    "SizeOfImage": 0x20,
    "FullDllName": 0x24,
    "BaseDllName": 0x2C,
}
# ARM64 uses the x64 entry: the structure is the same 64-bit one (assumed from the
# shared definition; the real ARM64 small dump's driver-list copies agree on
# DllBase +0x30 and SizeOfImage +0x40).
KLDR_DATA_TABLE_ENTRY = {"x64": KLDR_DATA_TABLE_ENTRY_X64, "x86": KLDR_DATA_TABLE_ENTRY_X86,
                         "arm64": KLDR_DATA_TABLE_ENTRY_X64}

# -- thread contexts --------------------------------------------------------------

# AMD64 CONTEXT (0x4D0 bytes).  Register offsets, value sizes in bytes.
CONTEXT_AMD64 = {
    "size": 0x4D0,
    "flags": 0x10001F,              # AMD64 | CONTROL | INTEGER | SEGMENTS | FLOATING_POINT | DEBUG
    "ContextFlags": 0x30,
    "MxCsr": 0x34,
    "FltSave.MxCsr": 0x118,
    "registers": {
        "cs": (0x38, 2), "ds": (0x3A, 2), "es": (0x3C, 2), "fs": (0x3E, 2), "gs": (0x40, 2),
        "ss": (0x42, 2), "efl": (0x44, 4),
        "dr0": (0x48, 8), "dr1": (0x50, 8), "dr2": (0x58, 8), "dr3": (0x60, 8),
        "dr6": (0x68, 8), "dr7": (0x70, 8),
        "rax": (0x78, 8), "rcx": (0x80, 8), "rdx": (0x88, 8), "rbx": (0x90, 8),
        "rsp": (0x98, 8), "rbp": (0xA0, 8), "rsi": (0xA8, 8), "rdi": (0xB0, 8),
        "r8": (0xB8, 8), "r9": (0xC0, 8), "r10": (0xC8, 8), "r11": (0xD0, 8),
        "r12": (0xD8, 8), "r13": (0xE0, 8), "r14": (0xE8, 8), "r15": (0xF0, 8),
        "rip": (0xF8, 8),
    },
    # What a kernel thread's segment registers and flags hold when nothing is given.
    "defaults": {"cs": 0x10, "ds": 0x2B, "es": 0x2B, "fs": 0x53, "gs": 0x2B, "ss": 0x18,
                 "efl": 0x40202},
}

# x86 CONTEXT (0x2CC bytes): FLOATING_SAVE_AREA (112 bytes) at 0x1C, then the
# segment and integer registers, then 512 bytes of ExtendedRegisters.
CONTEXT_X86 = {
    "size": 0x2CC,
    "flags": 0x1003F,               # i386 | CONTROL | INTEGER | SEGMENTS | FLOATING_POINT | DEBUG | EXTENDED
    "ContextFlags": 0x00,
    "registers": {
        "dr0": (0x04, 4), "dr1": (0x08, 4), "dr2": (0x0C, 4), "dr3": (0x10, 4),
        "dr6": (0x14, 4), "dr7": (0x18, 4),
        "gs": (0x8C, 4), "fs": (0x90, 4), "es": (0x94, 4), "ds": (0x98, 4),
        "edi": (0x9C, 4), "esi": (0xA0, 4), "ebx": (0xA4, 4), "edx": (0xA8, 4),
        "ecx": (0xAC, 4), "eax": (0xB0, 4), "ebp": (0xB4, 4), "eip": (0xB8, 4),
        "cs": (0xBC, 4), "efl": (0xC0, 4), "esp": (0xC4, 4), "ss": (0xC8, 4),
    },
    "defaults": {"cs": 0x23, "ds": 0x2B, "es": 0x2B, "fs": 0x53, "gs": 0x2B, "ss": 0x2B,
                 "efl": 0x202},
}

CONTEXTS = {"x64": CONTEXT_AMD64, "x86": CONTEXT_X86, "arm64": CONTEXT_ARM64}

# -- user-mode minidump -------------------------------------------------------------

MINIDUMP_SIGNATURE = b"MDMP"
MINIDUMP_VERSION = 0xA793
MINIDUMP_HEADER_SIZE = 0x20
MINIDUMP_DIRECTORY_ENTRY_SIZE = 12
MINIDUMP_STREAM = {
    "ThreadList": 3,
    "ModuleList": 4,
    "MemoryList": 5,
    "Exception": 6,
    "SystemInfo": 7,
    "Memory64List": 9,
    "UnloadedModuleList": 14,
    "MemoryInfoList": 16,
    "ThreadInfoList": 17,
    "ThreadNames": 24,
}
MINIDUMP_SYSTEM_INFO_SIZE = 56
# MINIDUMP_SYSTEM_INFO: u16 ProcessorArchitecture, ProcessorLevel, ProcessorRevision,
# u8 NumberOfProcessors, ProductType, u32 MajorVersion, MinorVersion, BuildNumber,
# PlatformId, CSDVersionRva (a MINIDUMP_STRING), u16 SuiteMask, Reserved2, then
# CPU_INFORMATION (24 bytes; x86: char VendorId[12], Version, Features, AMD features).
MINIDUMP_SYSTEM_INFO = {
    "format": "<HHHBBIIIIIHH",
    "fields": ("ProcessorArchitecture", "ProcessorLevel", "ProcessorRevision", "NumberOfProcessors",
               "ProductType", "MajorVersion", "MinorVersion", "BuildNumber", "PlatformId", "CSDVersionRva",
               "SuiteMask", "Reserved2"),
    "VendorId": 0x20,
}
# PlatformId: Windows' VER_PLATFORM_* and the values breakpad and crashpad write
# for other systems (breakpad's minidump_format.h MD_OS_*).
MINIDUMP_PLATFORMS = {0: "Win32s", 1: "Windows 9x", 2: "Windows", 3: "Windows CE", 0x8000: "Unix",
                      0x8101: "macOS", 0x8102: "iOS", 0x8201: "Linux", 0x8202: "Solaris", 0x8203: "Android",
                      0x8204: "PS3", 0x8205: "Native Client", 0x8206: "Fuchsia"}
WINDOWS_PLATFORM = 2
PRODUCT_TYPES = {1: "workstation", 2: "domain controller", 3: "server"}
MINIDUMP_MODULE_SIZE = 108
MINIDUMP_THREAD_SIZE = 48
# MINIDUMP_EXCEPTION_STREAM: u32 ThreadId, u32 pad, MINIDUMP_EXCEPTION (EXCEPTION_RECORD64
# layout), then the thread's context location {u32 DataSize, u32 Rva}.
MINIDUMP_EXCEPTION_STREAM = {"ThreadId": 0x00, "ExceptionRecord": 0x08, "ThreadContext": 0xA0,
                             "size": 0xA8}
# The list streams below start with a header giving its own size and the entry
# size (readers must step by SizeOfEntry: newer writers append fields).
# MINIDUMP_THREAD_INFO_LIST: u32 SizeOfHeader (12), u32 SizeOfEntry, u32 NumberOfEntries;
# MINIDUMP_THREAD_INFO: ThreadId, DumpFlags, DumpError, ExitStatus (u32), then u64
# CreateTime, ExitTime, KernelTime, UserTime, StartAddress, Affinity.
MINIDUMP_THREAD_INFO_LIST_HEADER = "<III"
MINIDUMP_THREAD_INFO = "<IIIIQQQQQQ"                  # 64 bytes
THREAD_INFO_FLAGS = {0x1: "error_thread", 0x2: "writing_thread", 0x4: "exited_thread",
                     0x8: "invalid_info", 0x10: "invalid_context", 0x20: "invalid_teb"}
# MINIDUMP_MEMORY_INFO_LIST: u32 SizeOfHeader (16), u32 SizeOfEntry, u64 NumberOfEntries;
# MINIDUMP_MEMORY_INFO: u64 BaseAddress, u64 AllocationBase, u32 AllocationProtect, u32 pad,
# u64 RegionSize, u32 State, u32 Protect, u32 Type, u32 pad.
MINIDUMP_MEMORY_INFO_LIST_HEADER = "<IIQ"
MINIDUMP_MEMORY_INFO = "<QQIIQIIII"                   # 48 bytes
MEM_COMMIT = 0x1000
MEMORY_STATES = {MEM_COMMIT: "MEM_COMMIT", 0x2000: "MEM_RESERVE", 0x10000: "MEM_FREE"}
MEMORY_TYPES = {0x20000: "MEM_PRIVATE", 0x40000: "MEM_MAPPED", 0x1000000: "MEM_IMAGE"}
PAGE_PROTECTIONS = {0x01: "PAGE_NOACCESS", 0x02: "PAGE_READONLY", 0x04: "PAGE_READWRITE",
                    0x08: "PAGE_WRITECOPY", 0x10: "PAGE_EXECUTE", 0x20: "PAGE_EXECUTE_READ",
                    0x40: "PAGE_EXECUTE_READWRITE", 0x80: "PAGE_EXECUTE_WRITECOPY"}
PAGE_MODIFIERS = {0x100: "PAGE_GUARD", 0x200: "PAGE_NOCACHE", 0x400: "PAGE_WRITECOMBINE"}
# MINIDUMP_UNLOADED_MODULE_LIST: u32 SizeOfHeader (12), u32 SizeOfEntry, u32 NumberOfEntries;
# MINIDUMP_UNLOADED_MODULE: u64 BaseOfImage, u32 SizeOfImage, CheckSum, TimeDateStamp, ModuleNameRva.
MINIDUMP_UNLOADED_MODULE_LIST_HEADER = "<III"
MINIDUMP_UNLOADED_MODULE = "<QIIII"                   # 24 bytes
# MINIDUMP_THREAD_NAME_LIST: u32 NumberOfThreadNames; MINIDUMP_THREAD_NAME: u32 ThreadId,
# u64 RvaOfThreadName (a MINIDUMP_STRING; packed, 12 bytes per entry).
MINIDUMP_THREAD_NAME = "<IQ"
# NT_TIB at the start of a TEB: the stack's bounds (StackBase is the high end).
# ARM64's NT_TIB is the 64-bit one (winnt.h defines one NT_TIB64 for both).
TEB_STACK = {"x64": {"StackBase": 0x08, "StackLimit": 0x10}, "x86": {"StackBase": 0x04, "StackLimit": 0x08}}
TEB_STACK["arm64"] = TEB_STACK["x64"]
PROCESSOR_ARCHITECTURE = {"x64": 9, "x86": 0, "arm64": 12}
ARCH_OF_PROCESSOR = dict((number, arch) for arch, number in PROCESSOR_ARCHITECTURE.items())

# TEB -> PEB -> RTL_USER_PROCESS_PARAMETERS, per arch: what a process's first
# thread points at (the ``minidump`` package walks it when a thread list exists).
PROCESS_BLOCKS = {
    "x64": {"teb_size": 0x1000, "Teb.Peb": 0x60, "peb_size": 0x400, "Peb.ImageBaseAddress": 0x10,
            "Peb.ProcessParameters": 0x20, "params_size": 0x400, "Params.Environment": 0x80,
            "Params.strings": (0x38, 0x50, 0x60, 0x70, 0xB0)},
    "x86": {"teb_size": 0x1000, "Teb.Peb": 0x30, "peb_size": 0x250, "Peb.ImageBaseAddress": 0x08,
            "Peb.ProcessParameters": 0x10, "params_size": 0x2A0, "Params.Environment": 0x48,
            "Params.strings": (0x24, 0x30, 0x38, 0x40, 0x70)},
}
# Assumed, not checked on a real ARM64 minidump: the TEB, PEB and process parameters
# are the 64-bit structures of x64 (their definitions are not per architecture).
PROCESS_BLOCKS["arm64"] = PROCESS_BLOCKS["x64"]
