"""Intel's libipt (Debian libipt2) as the oracle for the ipt tests, through the
back end's ctypes declarations (dbgext/ipt/libipt_api.py).

Only what the differential tests and the benchmark need: the packet encoder, the
packet decoder, and the instruction / block flow decoders over an image whose
memory is served by a Python callback.
"""

import ctypes
import struct

import requirements
from dbgext.errors import BadInput
from dbgext.ipt import libipt_api
# The declarations are the back end's (dbgext/ipt/libipt_api.py): one set.
from dbgext.ipt.libipt_api import (EVENT_TYPES, INSN_CLASS_ERROR, PTE_EOS, PTE_NOMAP, PTS_EOS, PTS_EVENT_PENDING,
                                   READ_MEMORY, Block, Event, Insn)
from dbgext.ipt.libipt_api import Packet as RawPacket

PPT = libipt_api.PACKET_TYPES
PPT_CODE = {name: code for code, name in enumerate(PPT)}
EVENT_SIZE = ctypes.sizeof(Event)


def _load():
    try:
        return libipt_api.load()
    except BadInput:
        return None


LIB = _load()
# A skip for this reason fails the run (tests/requirements.py).
SKIP_REASON = requirements.MISSING + "library libipt (apt-get install libipt2 libipt-dev)"


def _config(buffer):
    return libipt_api.config_for(buffer, len(buffer))


# -- encoding ---------------------------------------------------------------------

def packet(type_name, **fields):
    """A pt_packet to encode: ``packet("tip", ipc=1, ip=0x1234)``, ``packet("tnt8", bits="TNT")``..."""
    raw = RawPacket()
    raw.type = PPT_CODE[type_name]
    payload = bytearray(16)
    if type_name in ("fup", "tip", "tip.pge", "tip.pgd"):
        struct.pack_into("<iIQ", payload, 0, fields.get("ipc", 0), 0, fields.get("ip", 0))
    elif type_name in ("tnt8", "tnt64"):
        bits = fields["bits"]
        value = 0
        for bit in bits:
            value = value << 1 | (bit == "T")
        struct.pack_into("<B7xQ", payload, 0, len(bits), value)
    elif type_name == "mode":
        struct.pack_into("<iI", payload, 0, fields["leaf"], fields["bits"])
    elif type_name == "pip":
        struct.pack_into("<QI", payload, 0, fields["cr3"], fields.get("nr", 0))
    elif type_name in ("tsc", "cyc", "vmcs", "mnt"):
        struct.pack_into("<Q", payload, 0, fields["value"])
    elif type_name in ("cbr", "mtc"):
        payload[0] = fields["value"]
    elif type_name == "tma":
        struct.pack_into("<HH", payload, 0, fields["ctc"], fields["fc"])
    elif type_name == "exstop":
        struct.pack_into("<I", payload, 0, fields.get("ip", 0))
    elif type_name == "mwait":
        struct.pack_into("<II", payload, 0, fields["hints"], fields["ext"])
    elif type_name == "pwre":
        struct.pack_into("<BBB", payload, 0, fields["state"], fields["sub_state"], fields.get("hw", 0))
    elif type_name == "pwrx":
        flags = fields.get("interrupt", 0) | fields.get("store", 0) << 1 | fields.get("autonomous", 0) << 2
        struct.pack_into("<BBB", payload, 0, fields["last"], fields["deepest"], flags)
    elif type_name == "ptw":
        struct.pack_into("<QBB", payload, 0, fields["payload"], fields["plc"], fields.get("ip", 0))
    raw.payload[:] = list(payload)
    return raw


def encode(packets, capacity=1 << 16):
    """Encode pt_packets with libipt's encoder; returns the bytes."""
    buffer = (ctypes.c_uint8 * capacity)()
    config = _config(buffer)
    encoder = LIB.pt_alloc_encoder(ctypes.byref(config))
    try:
        for raw in packets:
            status = LIB.pt_enc_next(encoder, ctypes.byref(raw), ctypes.sizeof(RawPacket))
            if status < 0:
                raise ValueError("libipt encoder: error %d on %s" % (status, PPT[raw.type]))
        offset = ctypes.c_uint64()
        LIB.pt_enc_get_offset(encoder, ctypes.byref(offset))
        return bytes(buffer[:offset.value])
    finally:
        LIB.pt_free_encoder(encoder)


# -- packet decoding ----------------------------------------------------------------

def decode_packets(data):
    """libipt's packet decoder from the first PSB: [(offset, type, fields)], [(offset, status)].

    IP packets come with libipt's raw payload (``ipc``, ``payload``); TNT with ``bits``."""
    buffer = libipt_api.trace_buffer(data)
    config = _config(buffer)
    config.end = config.begin + len(data)
    decoder = LIB.pt_pkt_alloc_decoder(ctypes.byref(config))
    packets, errors = [], []
    offset = ctypes.c_uint64()
    try:
        status = LIB.pt_pkt_sync_forward(decoder)
        while status >= 0:
            LIB.pt_pkt_get_offset(decoder, ctypes.byref(offset))
            raw = RawPacket()
            status = LIB.pt_pkt_next(decoder, ctypes.byref(raw), ctypes.sizeof(RawPacket))
            if status < 0:
                if status == -PTE_EOS:
                    break
                errors.append((offset.value, status))
                status = LIB.pt_pkt_sync_forward(decoder)
                continue
            packets.append((offset.value, PPT[raw.type], _fields(raw)))
    finally:
        LIB.pt_pkt_free_decoder(decoder)
    return packets, errors


def _fields(raw):
    payload = bytes(raw.payload)
    name = PPT[raw.type]
    if name in ("fup", "tip", "tip.pge", "tip.pgd"):
        ipc, _, ip = struct.unpack_from("<iIQ", payload)
        return {"ipc": ipc, "payload": ip}
    if name in ("tnt8", "tnt64"):
        count, value = struct.unpack_from("<B7xQ", payload)
        return {"bits": "".join("T" if value >> (count - 1 - i) & 1 else "N" for i in range(count))}
    if name == "mode":
        leaf, bits = struct.unpack_from("<iI", payload)
        return {"leaf": leaf, "bits": bits & 7 if leaf == 0 else bits & 3}
    if name == "pip":
        cr3, nr = struct.unpack_from("<QI", payload)
        return {"cr3": cr3, "nr": nr & 1}
    if name in ("tsc", "cyc", "vmcs", "mnt"):
        return {"value": struct.unpack_from("<Q", payload)[0]}
    if name in ("cbr", "mtc"):
        return {"value": payload[0]}
    if name == "tma":
        ctc, fc = struct.unpack_from("<HH", payload)
        return {"ctc": ctc, "fc": fc}
    if name == "exstop":
        return {"ip": payload[0] & 1}
    if name == "mwait":
        hints, ext = struct.unpack_from("<II", payload)
        return {"hints": hints, "ext": ext}
    if name == "pwre":
        state, sub, hw = struct.unpack_from("<BBB", payload)
        return {"state": state, "sub_state": sub, "hw": hw & 1}
    if name == "pwrx":
        last, deepest, flags = struct.unpack_from("<BBB", payload)
        return {"last": last, "deepest": deepest, "interrupt": flags & 1, "store": flags >> 1 & 1,
                "autonomous": flags >> 2 & 1}
    if name == "ptw":
        value, plc, ip = struct.unpack_from("<QBB", payload)
        return {"payload": value, "plc": plc, "ip": ip & 1}
    return {}


# -- flow decoding ------------------------------------------------------------------

class _Memory(object):
    """Serves libipt's image callback from {base: bytes} regions (kept alive with the decoder)."""

    def __init__(self, regions):
        self.regions = sorted(regions.items())
        self.callback = READ_MEMORY(self._read)

    def _read(self, buffer, size, asid, ip, context):
        for base, code in self.regions:
            if base <= ip < base + len(code):
                chunk = code[ip - base:ip - base + size]
                ctypes.memmove(buffer, chunk, len(chunk))
                return len(chunk)
        return -PTE_NOMAP


def _event_ip(event):
    """(type name, the event's first IP field or None when suppressed) of a struct pt_event."""
    kind, flags = struct.unpack_from("<iI", bytes(event))
    ip = None if flags & 1 else struct.unpack_from("<Q", bytes(event), 40)[0]
    return EVENT_TYPES[kind] if kind < len(EVENT_TYPES) else str(kind), ip


def instruction_segments(trace, regions, cpu=None, max_insns=10 ** 7, events=None):
    """libipt's instruction flow decoder, one segment per synchronization:
    [(instruction IPs, (offset, status) of the error that ended it or None)].

    Errors (of an instruction or of an event) resync at the next PSB, as ptxed does.  ``cpu``: (family, model,
    stepping) whose errata workarounds libipt applies (pt_cpu_errata).  ``events``:
    a list to append (instructions before it, type name, IP) of each event to."""
    buffer = libipt_api.trace_buffer(trace)
    config = _config(buffer)
    config.end = config.begin + len(trace)
    if cpu is not None:
        struct.pack_into("<iHBB", config.cpu, 0, 1, *cpu)
        LIB.pt_cpu_errata(ctypes.byref(config.errata), ctypes.byref(config.cpu))
    decoder = LIB.pt_insn_alloc_decoder(ctypes.byref(config))
    memory = _Memory(regions)
    image = LIB.pt_insn_get_image(decoder)
    LIB.pt_image_set_callback(image, memory.callback, None)
    segments = []
    ips = []
    total = 0
    insn = Insn()
    event = (ctypes.c_uint8 * EVENT_SIZE)()
    offset = ctypes.c_uint64()

    def failed(status):
        LIB.pt_insn_get_offset(decoder, ctypes.byref(offset))
        segments.append((ips, (offset.value, status)))

    try:
        status = LIB.pt_insn_sync_forward(decoder)
        while total < max_insns:
            if status < 0:
                if status == -PTE_EOS:
                    break
                failed(status)
                ips = []
                status = LIB.pt_insn_sync_forward(decoder)
                continue
            while status & PTS_EVENT_PENDING:
                status = LIB.pt_insn_event(decoder, event, EVENT_SIZE)
                if status < 0:
                    break
                if events is not None:
                    events.append((total,) + _event_ip(event))
            if status >= 0 and status & PTS_EOS:
                # The end of the trace, its events drained: as ptxed, no further
                # instruction (libipt would go on with straight-line code until it
                # needs trace again).
                break
            if status < 0:
                continue
            insn.iclass = INSN_CLASS_ERROR   # pt_insn_next may fail before it writes insn
            status = LIB.pt_insn_next(decoder, ctypes.byref(insn), ctypes.sizeof(Insn))
            if status < 0 and insn.iclass == INSN_CLASS_ERROR:
                continue
            # As ptxed, an instruction counts when pt_insn_next decoded it (its class is set),
            # also when proceeding past it then failed (a query for its branch, an event after it).
            ips.append(insn.ip)
            total += 1
        segments.append((ips, None))
    finally:
        LIB.pt_insn_free_decoder(decoder)
    return segments


def instruction_flow(trace, regions, cpu=None, max_insns=10 ** 7):
    """libipt's instruction flow: (instruction IPs, [(offset, status)] errors)."""
    segments = instruction_segments(trace, regions, cpu, max_insns)
    return ([ip for ips, _ in segments for ip in ips],
            [error for _, error in segments if error is not None])


def block_flow_count(trace, regions):
    """libipt's block decoder: total instructions (for the benchmark)."""
    buffer = libipt_api.trace_buffer(trace)
    config = _config(buffer)
    config.end = config.begin + len(trace)
    decoder = LIB.pt_blk_alloc_decoder(ctypes.byref(config))
    memory = _Memory(regions)
    LIB.pt_image_set_callback(LIB.pt_blk_get_image(decoder), memory.callback, None)
    block = Block()
    event = (ctypes.c_uint8 * EVENT_SIZE)()
    total = 0
    try:
        status = LIB.pt_blk_sync_forward(decoder)
        while status >= 0:
            while status & PTS_EVENT_PENDING:
                status = LIB.pt_blk_event(decoder, event, EVENT_SIZE)
                if status < 0:
                    break
            if status < 0:
                break
            status = LIB.pt_blk_next(decoder, ctypes.byref(block), ctypes.sizeof(Block))
            if status < 0:
                if status != -PTE_EOS:
                    status = LIB.pt_blk_sync_forward(decoder)
                continue
            total += block.ninsn
    finally:
        LIB.pt_blk_free_decoder(decoder)
    return total


def packet_decode_count(data):
    """libipt packet decoding of the whole buffer, counting packets (for the benchmark)."""
    buffer = libipt_api.trace_buffer(data)
    config = _config(buffer)
    config.end = config.begin + len(data)
    decoder = LIB.pt_pkt_alloc_decoder(ctypes.byref(config))
    raw = RawPacket()
    count = 0
    size = ctypes.sizeof(RawPacket)
    next_packet = LIB.pt_pkt_next
    try:
        status = LIB.pt_pkt_sync_forward(decoder)
        while status >= 0:
            status = next_packet(decoder, ctypes.byref(raw), size)
            if status >= 0:
                count += 1
            elif status != -PTE_EOS:
                status = LIB.pt_pkt_sync_forward(decoder)
    finally:
        LIB.pt_pkt_free_decoder(decoder)
    return count


# -- a PE file whose file layout differs from its memory layout ---------------------------

def build_pe(code, image_base, exports, text_rva=0x1000):
    """A minimal x64 PE: .text (the code at ``text_rva``) and .edata exporting
    ``exports`` ({name: rva}); FileAlignment 0x200, SectionAlignment 0x1000, so the
    code sits at file offset 0x200 but at ``image_base + text_rva`` once mapped."""
    def align(value, to):
        return (value + to - 1) // to * to

    file_align, section_align = 0x200, 0x1000
    text_raw = align(len(code), file_align)
    edata_rva = text_rva + align(len(code), section_align)
    names = sorted(exports)
    module_name = b"iptpe.sys\0"
    directory_size = 40
    functions_at = edata_rva + directory_size
    names_at = functions_at + 4 * len(names)
    ordinals_at = names_at + 4 * len(names)
    strings_at = ordinals_at + 2 * len(names)
    strings = bytearray(module_name)
    name_rvas = []
    for name in names:
        name_rvas.append(strings_at + len(strings))
        strings += name.encode() + b"\0"
    edata = struct.pack("<IIHHIIIIIII", 0, 0, 0, 0, strings_at, 1, len(names), len(names), functions_at,
                        names_at, ordinals_at)
    edata += b"".join(struct.pack("<I", exports[name]) for name in names)
    edata += b"".join(struct.pack("<I", rva) for rva in name_rvas)
    edata += b"".join(struct.pack("<H", index) for index in range(len(names)))
    edata += bytes(strings)
    edata_raw = align(len(edata), file_align)
    size_of_image = edata_rva + align(len(edata), section_align)
    headers = bytearray(b"MZ" + bytes(0x3A) + struct.pack("<I", 0x40))
    headers += b"PE\0\0" + struct.pack("<HHIIIHH", 0x8664, 2, 0, 0, 0, 240, 0x2022)
    directories = bytearray(128)
    struct.pack_into("<II", directories, 0, edata_rva, len(edata))
    headers += struct.pack("<HBBIIIIIQIIHHHHHHIIIIHHQQQQII", 0x20B, 14, 0, text_raw, edata_raw, 0, text_rva,
                           text_rva, image_base, section_align, file_align, 10, 0, 0, 0, 10, 0, 0, size_of_image,
                           file_align, 0, 1, 0, 0x40000, 0x1000, 0x100000, 0x1000, 0, 16) + directories
    headers += struct.pack("<8sIIIIIIHHI", b".text", len(code), text_rva, text_raw, file_align, 0, 0, 0, 0,
                           0x60000020)
    headers += struct.pack("<8sIIIIIIHHI", b".edata", len(edata), edata_rva, edata_raw, file_align + text_raw,
                           0, 0, 0, 0, 0x40000040)
    headers += bytes(file_align - len(headers))
    return bytes(headers) + code + bytes(text_raw - len(code)) + edata + bytes(edata_raw - len(edata))
