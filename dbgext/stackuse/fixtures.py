"""Driver-like PE images built in Python, for tests and for ``dbgext sample``.

:func:`build_pe` lays out a small but real PE32/PE32+ image — ``.text`` with
hand-assembled functions, ``.rdata`` with UNWIND_INFO, exports and imports,
``.pdata`` with RUNTIME_FUNCTIONs — so no compiler is needed when the sample is
built.  :func:`add_sample_driver` places such a driver in a kernel-mode
:class:`~dbgext.sample.scenario.Scenario` together with a thread (a ``_KTHREAD``
with its stack bounds) whose stack runs through the driver, so the same fixture
serves the in-memory target and the dump files written from the scenario.
"""

import struct

from ..stacks.threads import SWITCH_FRAME_RETURN

SECTION_ALIGNMENT = 0x1000
TEXT_RVA = 0x1000

# Raw unwind slot helpers: (prolog offset, op, info) -> 16-bit slot.


def unwind_slot(prolog_offset, op, info=0):
    return prolog_offset | (op << 8) | (info << 12)


def push_slot(prolog_offset, register):
    return [unwind_slot(prolog_offset, 0, register)]


def alloc_slots(prolog_offset, size):
    """ALLOC_SMALL / ALLOC_LARGE slots for an allocation of ``size`` bytes."""
    if 8 <= size <= 128 and size % 8 == 0:
        return [unwind_slot(prolog_offset, 2, size // 8 - 1)]
    if size % 8 == 0 and size // 8 < 0x10000:
        return [unwind_slot(prolog_offset, 1, 0), size // 8]
    return [unwind_slot(prolog_offset, 1, 1), size & 0xFFFF, size >> 16]


class Function(object):
    """A function for :func:`build_pe`.

    ``body``: a list of ``bytes`` and tokens — ``("call", name)`` / ``("jmp", name)``
    (rel32 to another function), ``("call_import", "dll!name")`` (``call [IAT]``),
    ``("abs", name)`` (the function's or symbol's absolute address, pointer-sized
    on x86 only).  ``unwind``: None (no .pdata entry: a leaf) or a dict with
    ``slots`` (unwind code slots, already in reverse prologue order), optional
    ``prolog_size``, ``frame`` (register, offset) and ``chain_to`` (function name).
    """

    def __init__(self, name, body, unwind=None, export=True):
        self.name = name
        self.body = body
        self.unwind = unwind
        self.export = export


class BuiltImage(object):
    def __init__(self, data, rvas, image_base, size, iat):
        self.data = data          # the file bytes (file layout == memory layout)
        self.rvas = rvas          # function name -> rva
        self.image_base = image_base
        self.size = size          # SizeOfImage
        self.iat = iat            # "dll!name" -> IAT slot rva


def build_pe(arch, functions, image_base=None, imports=(), name="sample.sys"):
    """Assemble a PE image.  File alignment equals section alignment, so the file
    bytes are also the mapped image."""
    x64 = arch == "x64"
    pointer = 8 if x64 else 4
    if image_base is None:
        image_base = 0x140000000 if x64 else 0x10000000
    # -- .text: lay out functions (16-byte aligned, int3 padding) ---------------------
    rvas = {}
    cursor = TEXT_RVA
    sizes = {}
    for function in functions:
        rvas[function.name] = cursor
        size = sum(len(piece) if isinstance(piece, bytes) else _token_size(piece, x64) for piece in function.body)
        sizes[function.name] = size
        cursor = _align(cursor + size, 16)
    text_size = cursor - TEXT_RVA
    rdata_rva = _align(cursor, SECTION_ALIGNMENT)
    # -- .rdata: imports (IAT, lookup, names), unwind infos, export directory ---------
    rdata = bytearray()
    import_list = list(imports)
    iat = {}
    dlls = []
    for key in import_list:
        dll = key.split("!", 1)[0]
        if dll not in dlls:
            dlls.append(dll)
    descriptors_at = len(rdata)
    rdata += bytes(20 * (len(dlls) + 1))
    for dll_index, dll in enumerate(dlls):
        names = [key for key in import_list if key.split("!", 1)[0] == dll]
        lookup_at = len(rdata)
        rdata += bytes(pointer * (len(names) + 1))
        iat_at = len(rdata)
        rdata += bytes(pointer * (len(names) + 1))
        for index, key in enumerate(names):
            hint_at = len(rdata)
            rdata += b"\0\0" + key.split("!", 1)[1].encode() + b"\0"
            rdata += b"\0" * (len(rdata) & 1)
            fmt = "<Q" if x64 else "<I"
            struct.pack_into(fmt, rdata, lookup_at + pointer * index, rdata_rva + hint_at)
            struct.pack_into(fmt, rdata, iat_at + pointer * index, rdata_rva + hint_at)
            iat[key] = rdata_rva + iat_at + pointer * index
        dll_name_at = len(rdata)
        rdata += dll.encode() + b"\0"
        struct.pack_into("<IIIII", rdata, descriptors_at + 20 * dll_index, rdata_rva + lookup_at, 0, 0,
                         rdata_rva + dll_name_at, rdata_rva + iat_at)
    rdata += bytes(-len(rdata) % 4)
    unwind_rvas = {}
    for function in functions:
        if function.unwind is None or not x64:
            continue
        spec = function.unwind
        slots = list(spec.get("slots", []))
        flags = 4 if spec.get("chain_to") else spec.get("flags", 0)
        frame_register, frame_offset = spec.get("frame", (0, 0))
        unwind_rvas[function.name] = rdata_rva + len(rdata)
        rdata += struct.pack("<BBBB", spec.get("version", 1) | (flags << 3), spec.get("prolog_size", 0), len(slots),
                             frame_register | ((frame_offset // 16) << 4))
        rdata += struct.pack("<%dH" % len(slots), *slots) if slots else b""
        if len(slots) & 1:
            rdata += b"\0\0"
        if spec.get("chain_to"):
            rdata += struct.pack("<III", 0, 0, 0)  # patched below once all unwind RVAs are known
    # Patch the chained parents now that every unwind RVA is known.
    by_name = {function.name: function for function in functions}
    for function in functions:
        if x64 and function.unwind and function.unwind.get("chain_to"):
            parent = function.unwind["chain_to"]
            at = unwind_rvas[function.name] - rdata_rva
            count = len(function.unwind.get("slots", []))
            at += 4 + 2 * (count + (count & 1))
            parent_unwind = unwind_rvas.get(parent, function.unwind.get("chain_unwind_rva", 0))
            struct.pack_into("<III", rdata, at, rvas[parent], rvas[parent] + sizes[by_name[parent].name],
                             parent_unwind)
    exported = [function for function in functions if function.export]
    export_at = len(rdata)
    rdata += bytes(40)
    functions_at = len(rdata)
    rdata += struct.pack("<%dI" % len(exported), *[rvas[f.name] for f in exported]) if exported else b""
    names_sorted = sorted(range(len(exported)), key=lambda i: exported[i].name)
    name_rvas_at = len(rdata)
    rdata += bytes(4 * len(exported))
    ordinals_at = len(rdata)
    rdata += struct.pack("<%dH" % len(exported), *names_sorted) if exported else b""
    rdata += bytes(-len(rdata) % 4)
    for slot, index in enumerate(names_sorted):
        struct.pack_into("<I", rdata, name_rvas_at + 4 * slot, rdata_rva + len(rdata))
        rdata += exported[index].name.encode() + b"\0"
    module_name_at = len(rdata)
    rdata += name.encode() + b"\0"
    struct.pack_into("<IIHHIIIIIII", rdata, export_at, 0, 0, 0, 0, rdata_rva + module_name_at, 1,
                     len(exported), len(exported), rdata_rva + functions_at, rdata_rva + name_rvas_at,
                     rdata_rva + ordinals_at)
    export_size = len(rdata) - export_at
    # -- .pdata -------------------------------------------------------------------------
    pdata_rva = _align(rdata_rva + len(rdata), SECTION_ALIGNMENT)
    pdata = bytearray()
    if x64:
        for function in sorted(functions, key=lambda f: rvas[f.name]):
            if function.unwind is None:
                continue
            begin = rvas[function.name]
            pdata += struct.pack("<III", begin, begin + sizes[function.name],
                                 function.unwind.get("unwind_rva", unwind_rvas[function.name]))
    size_of_image = _align(pdata_rva + max(len(pdata), 1), SECTION_ALIGNMENT)
    # -- code, now that every address is known -----------------------------------------------
    text = bytearray(b"\xcc" * text_size)
    for function in functions:
        at = rvas[function.name]
        for piece in function.body:
            if isinstance(piece, bytes):
                text[at - TEXT_RVA:at - TEXT_RVA + len(piece)] = piece
                at += len(piece)
                continue
            kind, target = piece
            if kind in ("call", "jmp"):
                opcode = b"\xe8" if kind == "call" else b"\xe9"
                encoded = opcode + struct.pack("<i", rvas[target] - (at + 5))
            elif kind == "call_import":
                slot = iat[target]
                if x64:
                    encoded = b"\xff\x15" + struct.pack("<i", slot - (at + 6))
                else:
                    encoded = b"\xff\x15" + struct.pack("<I", image_base + slot)
            elif kind == "abs":
                encoded = struct.pack("<I", image_base + rvas[target])
            else:
                raise ValueError("unknown token %r" % (kind,))
            text[at - TEXT_RVA:at - TEXT_RVA + len(encoded)] = encoded
            at += len(encoded)
    sections = [(b".text", TEXT_RVA, text_size, 0x60000020), (b".rdata", rdata_rva, len(rdata), 0x40000040)]
    if x64:
        sections.append((b".pdata", pdata_rva, max(len(pdata), 1), 0x40000040))
    headers = _headers(x64, image_base, size_of_image, rvas.get(functions[0].name, TEXT_RVA), sections,
                       export=(rdata_rva + export_at, export_size),
                       imports=(rdata_rva + descriptors_at, 20 * (len(dlls) + 1)) if dlls else (0, 0),
                       exception=(pdata_rva, len(pdata)) if x64 and pdata else (0, 0))
    image = bytearray(size_of_image)
    image[:len(headers)] = headers
    image[TEXT_RVA:TEXT_RVA + text_size] = text
    image[rdata_rva:rdata_rva + len(rdata)] = rdata
    image[pdata_rva:pdata_rva + len(pdata)] = pdata
    return BuiltImage(bytes(image), rvas, image_base, size_of_image, iat)


def _token_size(piece, x64):
    kind = piece[0]
    if kind in ("call", "jmp"):
        return 5
    if kind == "call_import":
        return 6
    if kind == "abs":
        return 4
    raise ValueError("unknown token %r" % (kind,))


def _align(value, alignment):
    return (value + alignment - 1) & ~(alignment - 1)


def _headers(x64, image_base, size_of_image, entry, sections, export, imports, exception):
    dos = bytearray(0x80)
    dos[:2] = b"MZ"
    struct.pack_into("<I", dos, 0x3C, 0x80)
    optional_size = 0xF0 if x64 else 0xE0
    file_header = struct.pack("<4sHHIIIHH", b"PE\0\0", 0x8664 if x64 else 0x14C, len(sections), 0, 0, 0,
                              optional_size, 0x2022 if x64 else 0x2102)
    directories = [(0, 0)] * 16
    directories[0] = export
    directories[1] = imports
    directories[3] = exception
    if x64:
        optional = struct.pack("<HBBIIIIIQIIHHHHHHIIIIHHQQQQII", 0x20B, 14, 0, 0, 0, 0, entry, TEXT_RVA,
                               image_base, SECTION_ALIGNMENT, SECTION_ALIGNMENT, 10, 0, 10, 0, 10, 0, 0,
                               size_of_image, 0x1000, 0, 1, 0, 0x40000, 0x1000, 0x100000, 0x1000, 0, 16)
    else:
        optional = struct.pack("<HBBIIIIIIIIIHHHHHHIIIIHHIIIIII", 0x10B, 14, 0, 0, 0, 0, entry, TEXT_RVA, 0,
                               image_base, SECTION_ALIGNMENT, SECTION_ALIGNMENT, 10, 0, 10, 0, 10, 0, 0,
                               size_of_image, 0x1000, 0, 1, 0, 0x40000, 0x1000, 0x100000, 0x1000, 0, 16)
    optional += b"".join(struct.pack("<II", rva, size) for rva, size in directories)
    assert len(optional) == optional_size
    table = b"".join(struct.pack("<8sIIIIIIHHI", name, size, rva, _align(size, SECTION_ALIGNMENT), rva, 0, 0, 0,
                                 0, characteristics)
                     for name, rva, size, characteristics in sections)
    return bytes(dos) + file_header + optional + table


# -- the sample driver ---------------------------------------------------------------------

SAMPLE_DRIVER_BASE = 0xFFFFF80123400000
SAMPLE_NT_BASE = 0xFFFFF80000000000
SAMPLE_STACK_SIZE = 0x6000  # 24 KiB, the x64 kernel stack
KTHREAD_FIELDS = {"InitialStack": 0x28, "StackLimit": 0x30, "KernelStack": 0x58}
KTHREAD_SIZE = 0x430
KPRCB_CURRENT_THREAD_OFFSET = 0x8
KPRCB_SIZE = 0x100


def sample_driver_functions():
    """A small x64 driver: DriverEntry -> Dispatch (0x228-byte frame) ->
    BuildRequest (home-space save, push, sub) -> CopyLeaf (a leaf without .pdata);
    DpcRoutine tail-calls CopyLeaf; Dispatch calls nt through the IAT."""
    return [
        Function("DriverEntry", [b"\x53", b"\x48\x83\xec\x20", b"\x89\xcb", ("call", "Dispatch"),
                                 b"\x48\x83\xc4\x20", b"\x5b", b"\xc3"],
                 {"prolog_size": 5, "slots": alloc_slots(5, 0x20) + push_slot(1, 3)}),
        Function("Dispatch", [b"\x48\x81\xec\x28\x02\x00\x00", b"\x48\x8d\x4c\x24\x20",
                              ("call", "BuildRequest"), ("call_import", "ntoskrnl.exe!KeQueryTimeIncrement"),
                              b"\x48\x81\xc4\x28\x02\x00\x00", b"\xc3"],
                 {"prolog_size": 7, "slots": alloc_slots(7, 0x228)}),
        Function("BuildRequest", [b"\x48\x89\x5c\x24\x08", b"\x57", b"\x48\x83\xec\x40", ("call", "CopyLeaf"),
                                  b"\x48\x83\xc4\x40", b"\x5f", b"\x48\x8b\x5c\x24\x08", b"\xc3"],
                 {"prolog_size": 10, "slots": alloc_slots(10, 0x40) + push_slot(6, 7)}),
        Function("DpcRoutine", [b"\x48\x83\xec\x28", ("call", "BuildRequest"), b"\x48\x83\xc4\x28",
                                ("jmp", "CopyLeaf")],
                 {"prolog_size": 4, "slots": alloc_slots(4, 0x28)}),
        Function("CopyLeaf", [b"\x89\xc8", b"\xc3"], None, export=False),
    ]


def add_sample_driver(scenario, base=SAMPLE_DRIVER_BASE, name="sampledrv"):
    """Place the sample driver in a kernel x64 ``scenario`` with a thread whose
    stack runs DriverEntry -> Dispatch -> BuildRequest -> CopyLeaf.

    What the scenario already has is kept: an existing ``nt`` module is only read
    (its ``KeQueryTimeIncrement`` symbol, when present, is where the driver's import
    is bound), existing ``_KTHREAD``/``_KPRCB`` field offsets are used (missing fields
    are added), an existing ``nt!KiProcessorBlock`` and context registers stay.  When
    absent they are created: a small ``nt`` image (IopLoadDriver, KeQueryTimeIncrement),
    a processor block whose current thread is the sample thread, and RIP/RSP in
    CopyLeaf — then the sample thread is the current one.

    Returns a dict: module, base, functions (name -> VA), thread (KTHREAD address),
    current (whether it is the current thread), stack_limit, initial_stack, rsp,
    frames (expected [(function, child-SP)] innermost first).
    """
    if scenario.arch != "x64" or scenario.mode != "kernel":
        raise ValueError("the sample driver needs a kernel-mode x64 scenario")
    if "nt" not in [module.name for module in scenario.modules]:
        # A small kernel image: IopLoadDriver calls DriverEntry through a register.
        kernel = build_pe("x64", [
            Function("IopLoadDriver", [b"\x48\x83\xec\x28", b"\xff\xd0", b"\x48\x83\xc4\x28", b"\xc3"],
                     {"prolog_size": 4, "slots": alloc_slots(4, 0x28)}),
            Function("KeQueryTimeIncrement", [b"\xb8\x10\x27\x00\x00", b"\xc3"]),
        ], image_base=SAMPLE_NT_BASE, name="ntoskrnl.exe")
        scenario.add_module("nt", SAMPLE_NT_BASE, kernel.size, image="ntoskrnl.exe", content=kernel.data)
        for function_name, rva in kernel.rvas.items():
            scenario.add_symbol("nt", function_name, rva)
        nt_return = SAMPLE_NT_BASE + kernel.rvas["IopLoadDriver"] + 4 + 2
    else:
        nt_return = scenario.module("nt").base + 0x1234
    nt = scenario.module("nt")
    built = build_pe("x64", sample_driver_functions(), image_base=base,
                     imports=["ntoskrnl.exe!KeQueryTimeIncrement"], name=name + ".sys")
    scenario.add_module(name, base, built.size, image=name + ".sys", content=built.data)
    time_increment = scenario.module_symbols["nt"].symbols.get("KeQueryTimeIncrement")
    if time_increment is not None:
        # The loader bound the import: the IAT slot holds nt's address.
        scenario.write_pointer(base + built.iat["ntoskrnl.exe!KeQueryTimeIncrement"], nt.base + time_increment)
    functions = {}
    for function_name, rva in built.rvas.items():
        functions[function_name] = scenario.add_symbol(name, function_name, rva)
    # -- the thread ------------------------------------------------------------------------
    kthread_fields = _ensure_fields(scenario, "_KTHREAD", KTHREAD_SIZE, KTHREAD_FIELDS)
    prcb_fields = _ensure_fields(scenario, "_KPRCB", KPRCB_SIZE, {"CurrentThread": KPRCB_CURRENT_THREAD_OFFSET})
    stack_limit = scenario.alloc_pages(SAMPLE_STACK_SIZE)
    initial_stack = stack_limit + SAMPLE_STACK_SIZE
    kthread = scenario.alloc(scenario.module_symbols["nt"].types["_KTHREAD"]["size"])
    # Return addresses: just after each call instruction.
    after_call = {
        "BuildRequest": functions["BuildRequest"] + 5 + 1 + 4 + 5,   # after `call CopyLeaf`
        "Dispatch": functions["Dispatch"] + 7 + 5 + 5,               # after `call BuildRequest`
        "DriverEntry": functions["DriverEntry"] + 1 + 4 + 2 + 5,     # after `call Dispatch`
        "nt": nt_return,                                             # the I/O manager called DriverEntry
    }
    # Innermost first: (function, its frame size, the caller it returns into).
    # Each frame's child-SP is where RSP points inside it; its return address sits
    # frame-size bytes above, and the caller's child-SP is 8 bytes above that.
    frames = [("CopyLeaf", 0, "BuildRequest"), ("BuildRequest", 0x48, "Dispatch"),
              ("Dispatch", 0x228, "DriverEntry"), ("DriverEntry", 0x28, "nt")]
    used = sum(frame_size + 8 for _, frame_size, _ in frames)
    rsp = initial_stack - 0x100 - used  # room for the I/O manager's frames at the base
    child_sp = rsp
    expected = []
    for function_name, frame_size, caller in frames:
        expected.append((function_name, child_sp))
        scenario.write_pointer(child_sp + frame_size, after_call[caller])
        child_sp += frame_size + 8
    scenario.pack(kthread + kthread_fields["InitialStack"], "<Q", initial_stack)
    scenario.pack(kthread + kthread_fields["StackLimit"], "<Q", stack_limit)
    # Seen as a waiting thread, its switch frame's return address is the one at RSP.
    scenario.pack(kthread + kthread_fields["KernelStack"], "<Q", rsp - SWITCH_FRAME_RETURN)
    # The sample thread becomes the current one only when the scenario has neither
    # a processor block nor a context of its own (they would describe another thread).
    current = "KiProcessorBlock" not in scenario.module_symbols["nt"].symbols and \
        "rip" not in {key.lower() for key in scenario.registers}
    if current:
        prcb = scenario.alloc(KPRCB_SIZE)
        scenario.pack(prcb + prcb_fields["CurrentThread"], "<Q", kthread)
        block = scenario.alloc(8)
        scenario.write_pointer(block, prcb)
        scenario.add_symbol("nt", "KiProcessorBlock", block - nt.base)
        scenario.registers.update({"rip": functions["CopyLeaf"], "rsp": rsp})
    return {"module": name, "base": base, "functions": functions, "thread": kthread, "current": current,
            "stack_limit": stack_limit, "initial_stack": initial_stack, "rsp": rsp, "frames": expected}


def _ensure_fields(scenario, type_name, size, fields):
    """Declare ``nt!type_name`` or add the missing ``fields`` to the existing
    declaration; returns the offsets to use for ``fields``."""
    types = scenario.module_symbols["nt"].types
    existing = types.get(type_name)
    if existing is None:
        scenario.add_type("nt", type_name, size, dict(fields))
        return dict(fields)
    offsets = {}
    for field, offset in fields.items():
        if field not in existing["fields"]:
            existing["fields"][field] = {"offset": offset, "type": {"kind": "base", "name": "unsigned long long"}}
        offsets[field] = existing["fields"][field]["offset"]
    existing["size"] = max(existing["size"], size)
    return offsets
