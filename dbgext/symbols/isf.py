"""volatility3's Intermediate Symbol Format (ISF), read as untrusted input.

One JSON file (``.json``, ``.json.xz`` or ``.json.gz``) per module with module-relative symbol
addresses and user types with field offsets.  A file belongs to the module whose
debugger name equals the file's stem (``nt.json`` -> ``nt``) unless its metadata
names the module (``metadata.dbgext.module``).

Every field dbgext uses is checked for its type before it is used; a file that
fails raises :class:`IsfError` naming the file and the field (``symbols.Foo.address:
a float, not an integer``), so callers report it once and go on without it.
"""

import gzip
import io
import json
import lzma
import os

from ..errors import BadInput


COMPRESSED = (".json.xz", ".json.gz")
# The most an ISF file may hold, decompressed: a Windows kernel's is about 30 MB.
MAX_ISF_BYTES = 128 << 20


class IsfError(BadInput):
    def __init__(self, path, field, detail):
        self.path = path
        self.field = field
        super().__init__("bad ISF symbol file %s: %s: %s" % (path, field, detail))


class IsfDocument(object):
    """The validated parts of one ISF file."""

    __slots__ = ("path", "module_name", "symbols", "types", "base_types")

    def __init__(self, path, module_name, symbols, types, base_types):
        self.path = path
        self.module_name = module_name
        self.symbols = symbols        # {name: rva}
        self.types = types            # {name: {"size": n, "kind": str, "fields": {name: {"offset", "type"}}}}
        self.base_types = base_types  # {name: {"size": n, "signed": bool}}


def _kind(value):
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return {dict: "an object", list: "a list", str: "a string", float: "a float", int: "an integer"}.get(
        type(value), type(value).__name__)


def _expect(path, field, value, wanted, signed=False):
    """``value`` if it is of type ``wanted`` (int: an integer, not a boolean, and
    non-negative unless ``signed``), else IsfError saying what was found."""
    if wanted is int:
        if isinstance(value, int) and not isinstance(value, bool):
            if signed or value >= 0:
                return value
            raise IsfError(path, field, "a negative integer")
        raise IsfError(path, field, "%s, not an integer" % _kind(value))
    if not isinstance(value, wanted):
        raise IsfError(path, field, "%s, not %s" % (_kind(value), _kind(wanted())))
    return value


def _optional_object(path, document, key):
    value = document.get(key, {})
    return _expect(path, key, value, dict)


def parse_isf(document, path, default_module):
    """An :class:`IsfDocument` from a decoded JSON value (anything)."""
    _expect(path, "(top level)", document, dict)
    module_name = default_module
    metadata = _optional_object(path, document, "metadata")
    dbgext_meta = _expect(path, "metadata.dbgext", metadata.get("dbgext", {}), dict)
    if "module" in dbgext_meta:
        module_name = _expect(path, "metadata.dbgext.module", dbgext_meta["module"], str)
        if not module_name:
            raise IsfError(path, "metadata.dbgext.module", "an empty name")
    symbols = {}
    for name, entry in _optional_object(path, document, "symbols").items():
        field = "symbols.%s" % name
        _expect(path, field, entry, dict)
        if "address" in entry:
            # An RVA: our own writer lays some globals out below the image base.
            symbols[name] = _expect(path, field + ".address", entry["address"], int, signed=True)
    base_types = {}
    for name, entry in _optional_object(path, document, "base_types").items():
        field = "base_types.%s" % name
        _expect(path, field, entry, dict)
        base_types[name] = {"size": _expect(path, field + ".size", entry.get("size", 0), int),
                            "signed": bool(entry.get("signed", False))}
    types = {}
    for name, entry in _optional_object(path, document, "user_types").items():
        field = "user_types.%s" % name
        _expect(path, field, entry, dict)
        fields = {}
        for field_name, spec in _expect(path, field + ".fields", entry.get("fields", {}), dict).items():
            where = "%s.fields.%s" % (field, field_name)
            _expect(path, where, spec, dict)
            if "offset" not in spec:
                raise IsfError(path, where + ".offset", "missing")
            fields[field_name] = {"offset": _expect(path, where + ".offset", spec["offset"], int),
                                  "type": _expect(path, where + ".type", spec.get("type", {}), dict)}
        kind = entry.get("kind", "struct")
        types[name] = {"size": _expect(path, field + ".size", entry.get("size", 0), int),
                       "kind": kind if isinstance(kind, str) else "struct", "fields": fields}
    return IsfDocument(path, module_name, symbols, types, base_types)


def read_isf_file(path):
    """Read and validate one ISF file; IsfError/BadInput name the file.

    A compressed file is read as a stream and refused once it has given
    ``MAX_ISF_BYTES`` (a few hundred kilobytes of ``.xz`` can hold gigabytes of
    spaces); a JSON document nested deeper than the parser's recursion allows is
    refused in one line ("nested too deeply")."""
    stem = os.path.basename(path).split(".json")[0]
    try:
        with _open(path) as handle:
            text = handle.read(MAX_ISF_BYTES + 1)
        if len(text) > MAX_ISF_BYTES:
            raise BadInput("cannot read symbol file %s: more than %d bytes%s"
                           % (path, MAX_ISF_BYTES, " once decompressed" if path.endswith(COMPRESSED) else ""))
        document = json.loads(text.decode("utf-8"))
    except (OSError, ValueError, EOFError, lzma.LZMAError) as error:
        raise BadInput("cannot read symbol file %s: %s" % (path, error))
    except RecursionError:
        raise BadInput("cannot read symbol file %s: nested too deeply" % path)
    return parse_isf(document, path, stem)


def _open(path):
    if path.endswith(".xz"):
        return lzma.open(path, "rb")
    if path.endswith(".gz"):
        return gzip.open(path, "rb")
    return io.open(path, "rb")


def is_isf_name(name):
    return name.endswith(".json") or name.endswith(COMPRESSED)
