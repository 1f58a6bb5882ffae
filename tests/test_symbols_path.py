"""The symbol path like WinDbg's: elements, store layout, GUID/age matching,
downloads from a symbol server (a local HTTP server the test starts), images."""

import http.server
import io
import os
import shutil
import threading
import time

import pytest

from symbols_support import build_dll

from dbgext.symbols.download import Limits, ProgressBar
from dbgext.symbols.path import SymbolLocator, parse_symbol_path, symbol_path_elements


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return build_dll(str(tmp_path_factory.mktemp("path-x64")), "x64")


class Reports(list):
    def __call__(self, kind, message):
        self.append((kind, message))


def store_path(root, built):
    """``root/name.pdb/<GUID><age>/name.pdb``: a symbol store holding ``built``'s PDB."""
    codeview = built.image.codeview
    name = os.path.basename(built.pdb)
    path = os.path.join(str(root), name, codeview.symbol_server_key, name)
    os.makedirs(os.path.dirname(path))
    shutil.copy(built.pdb, path)
    return path


def mismatched_copy(built, directory):
    """The PDB with one GUID byte changed: a PDB of another build."""
    data = bytearray(open(built.pdb, "rb").read())
    guid = built.image.codeview.guid
    at = data.find(guid)
    while at >= 0:
        data[at] ^= 0xFF
        at = data.find(guid, at + 1)
    path = os.path.join(str(directory), os.path.basename(built.pdb))
    with open(path, "wb") as handle:
        handle.write(bytes(data))
    return path


# -- parsing -------------------------------------------------------------------------------

def test_elements_follow_windbgs_syntax(tmp_path):
    directory = str(tmp_path)
    elements = parse_symbol_path("%s;srv*C:\\cache*https://msdl.microsoft.com/download/symbols;"
                                 "cache*/tmp/c2;srv*https://example.com/sym;nt.json;x.pdb;;" % directory)
    assert [(e.kind, e.path, e.stores, e.url) for e in elements] == [
        ("dir", directory, [], None),
        ("server", None, ["C:\\cache"], "https://msdl.microsoft.com/download/symbols"),
        ("dir", "/tmp/c2", [], None),
        ("server", None, ["/tmp/c2"], "https://example.com/sym"),   # cache* applies to what follows
        ("file", "nt.json", [], None),
        ("file", "x.pdb", [], None),
    ]


def test_symsrv_with_a_dll_and_srv_without_a_url_are_local_stores():
    elements = parse_symbol_path("symsrv*symsrv.dll*/var/sym*http://server/sym;srv*/opt/store")
    assert (elements[0].stores, elements[0].url) == (["/var/sym"], "http://server/sym")
    assert (elements[1].stores, elements[1].url) == (["/opt/store"], None)


def test_nt_symbol_path_is_used_unless_symbols_are_given():
    environ = {"_NT_SYMBOL_PATH": "srv*/c*http://s/sym"}
    assert [e.url for e in symbol_path_elements(None, [], environ)] == ["http://s/sym"]
    assert symbol_path_elements(["/nonexistent/x.pdb"], [], environ)[0].path == "/nonexistent/x.pdb"


# -- finding and matching ------------------------------------------------------------------

def test_a_pdb_is_found_in_a_plain_directory_a_store_and_as_a_file(tmp_path, built):
    codeview = built.image.codeview
    plain = tmp_path / "plain"
    plain.mkdir()
    shutil.copy(built.pdb, str(plain))
    stored = store_path(tmp_path / "store", built)
    for text, expected in ((str(plain), os.path.join(str(plain), os.path.basename(built.pdb))),
                           ("srv*%s" % (tmp_path / "store"), stored),
                           (built.pdb, built.pdb)):
        pdb = SymbolLocator(parse_symbol_path(text)).find_pdb(codeview, Reports())
        assert pdb is not None and pdb.path == expected
        pdb.close()


def test_a_mismatched_pdb_is_refused_like_windbg_and_the_search_goes_on(tmp_path, built):
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    mismatched_copy(built, wrong)
    right = tmp_path / "right"
    right.mkdir()
    shutil.copy(built.pdb, str(right))
    reports = Reports()
    pdb = SymbolLocator(parse_symbol_path("%s;%s" % (wrong, right))).find_pdb(built.image.codeview, reports)
    assert pdb.path.startswith(str(right))
    pdb.close()
    [(kind, message)] = reports
    assert kind == "mismatched_pdb" and "mismatched PDB" in message and str(wrong) in message
    assert built.image.codeview.guid_text in message


def test_a_broken_pdb_is_reported_with_its_path_and_skipped(tmp_path, built):
    broken = tmp_path / os.path.basename(built.pdb)
    broken.write_bytes(b"Microsoft C/C++ MSF 7.00\r\n\x1aDS\0\0\0" + b"\xff" * 100)
    reports = Reports()
    assert SymbolLocator(parse_symbol_path(str(tmp_path))).find_pdb(built.image.codeview, reports) is None
    assert reports[0][0] == "bad_symbol_file" and str(broken) in reports[0][1]


def test_module_images_come_from_the_same_store(tmp_path, built):
    image = built.image
    name = "kernel_shapes.sys"
    key = "%08X%x" % (image.timestamp, image.size_of_image)
    path = tmp_path / name / key / name
    path.parent.mkdir(parents=True)
    shutil.copy(built.dll, str(path))
    locator = SymbolLocator(parse_symbol_path("srv*%s" % tmp_path))
    assert locator.find_image(name, image.timestamp, image.size_of_image, Reports()) == str(path)
    assert locator.find_image(name, image.timestamp + 1, image.size_of_image, Reports()) is None


# -- downloads -----------------------------------------------------------------------------

class SymbolServer(object):
    """A symbol server on 127.0.0.1 serving a directory in store layout; it can
    be told to stall before answering."""

    def __init__(self, root):
        server = self
        self.requests = []
        self.stall = 0

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, directory=str(root), **kwargs)

            def do_GET(self):
                server.requests.append(self.path)
                time.sleep(server.stall)
                super().do_GET()

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d/symbols" % self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server(tmp_path, built):
    store_path(tmp_path / "served" / "symbols", built)
    running = SymbolServer(tmp_path / "served")
    yield running
    running.close()


def test_a_pdb_missing_from_the_cache_is_downloaded_with_a_progress_bar(tmp_path, built, server):
    cache = tmp_path / "cache"
    progress = io.StringIO()
    locator = SymbolLocator(parse_symbol_path("srv*%s*%s" % (cache, server.url)), progress=ProgressBar(progress))
    pdb = locator.find_pdb(built.image.codeview, Reports())
    assert pdb is not None and pdb.path.startswith(str(cache))
    pdb.close()
    size = os.path.getsize(built.pdb) / 1e6
    assert progress.getvalue() == "downloading %s: %.1f MB\n" % (os.path.basename(built.pdb), size)
    # The second time it comes from the cache.
    again = SymbolLocator(parse_symbol_path("srv*%s*%s" % (cache, server.url)), progress=ProgressBar(progress))
    again.find_pdb(built.image.codeview, Reports()).close()
    assert len(server.requests) == 1


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_on_a_terminal_the_progress_bar_is_redrawn_in_place(tmp_path, built, server):
    progress = Terminal()
    SymbolLocator(parse_symbol_path("srv*%s*%s" % (tmp_path / "cache", server.url)),
                  progress=ProgressBar(progress)).find_pdb(built.image.codeview, Reports()).close()
    assert "\rdownloading %s [%s] 100%%" % (os.path.basename(built.pdb), "#" * 30) in progress.getvalue()


def test_no_download_means_no_request(tmp_path, built, server):
    locator = SymbolLocator(parse_symbol_path("srv*%s*%s" % (tmp_path / "cache", server.url)), no_download=True)
    assert locator.find_pdb(built.image.codeview, Reports()) is None
    assert server.requests == []


def test_a_file_the_server_lacks_is_reported_once(tmp_path, built, server):
    shutil.rmtree(str(tmp_path / "served" / "symbols"))
    locator = SymbolLocator(parse_symbol_path("srv*%s*%s" % (tmp_path / "cache", server.url)))
    reports = Reports()
    for _ in range(2):
        assert locator.find_pdb(built.image.codeview, reports) is None
    # Asked for as symsrv asks: name.pdb, then name.pd_, then file.ptr.
    name = os.path.basename(built.pdb)
    assert [request.rsplit("/", 1)[-1] for request in server.requests] == [name, name[:-1] + "_", "file.ptr"]
    assert len(reports) == 1 and "HTTP 404" in reports[0][1]
    # Nor does the next target of the same process ask again (batch triage).
    SymbolLocator(parse_symbol_path("srv*%s*%s" % (tmp_path / "cache", server.url))).find_pdb(
        built.image.codeview, reports)
    assert len(server.requests) == 3
    assert os.listdir(str(tmp_path / "cache" / name / built.image.codeview.symbol_server_key)) == []


def test_a_silent_server_times_out(tmp_path, built, server):
    server.stall = 2
    locator = SymbolLocator(parse_symbol_path("srv*%s*%s" % (tmp_path / "cache", server.url)),
                            limits=Limits(timeout=0.3))
    reports = Reports()
    assert locator.find_pdb(built.image.codeview, reports) is None
    assert "timed out" in reports[0][1]


def test_an_unchanged_pdb_is_opened_and_parsed_once_per_process(tmp_path, built):
    from dbgext.symbols.path import open_pdb
    path = tmp_path / "copy.pdb"
    shutil.copy(built.pdb, str(path))
    first = open_pdb(str(path))
    first.publics()
    assert open_pdb(str(path)) is first
    first.close()                       # a user of the shared file closed it: it is opened again
    reopened = open_pdb(str(path))
    assert reopened is not first and not reopened.closed
    os.utime(str(path), ns=(1, 1))      # rewritten: read again
    assert open_pdb(str(path)) is not reopened
