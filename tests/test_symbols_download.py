"""The symbol-server client against a hostile server the test starts on 127.0.0.1:
every case says what the server (or the image naming the PDB) does and what dbgext
must do.  The PDBs are real ones Microsoft's linker wrote (../shared/realworld/pdb)."""

import http.server
import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest

from symbols_support import REALWORLD_PDB

from dbgext.pe import CodeView, PEImage
from dbgext.symbols import path as symbol_path
from dbgext.symbols.download import Limits
from dbgext.symbols.path import SymbolLocator, parse_symbol_path

DRIVER = os.path.join(REALWORLD_PDB, "msvc2013-x64-kmdf-driver")
DRIVER_PDB = os.path.join(DRIVER, "Native_x64_VS2013_KernelModeDriver.pdb")
DRIVER_IMAGE = os.path.join(DRIVER, "Native_x64_VS2013_KernelModeDriver.sys")
CAB = os.path.join(REALWORLD_PDB, "msvc2017-x86-basic32-cab")
OTHER_PDB = os.path.join(REALWORLD_PDB, "msvc2013-x86-kmdf-driver", "Native_x86_VS2013_KernelModeDriver.pdb")
HERE = os.path.dirname(os.path.abspath(__file__))


def driver_codeview(name=None):
    codeview = PEImage.from_file(DRIVER_IMAGE).codeview
    return CodeView(codeview.guid, codeview.age, name if name is not None else os.path.basename(DRIVER_PDB))


def read(path):
    with open(path, "rb") as handle:
        return handle.read()


class Reports(list):
    def __call__(self, kind, message):
        self.append((kind, message))

    @property
    def text(self):
        return "\n".join(message for _, message in self)


class HostileServer(object):
    """``routes``: {URL path: bytes to serve, or a function(handler) that answers};
    anything else is a 404.  ``requests`` lists the paths asked for, as sent."""

    def __init__(self):
        server = self
        self.routes = {}
        self.requests = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                server.requests.append(self.path)
                route = server.routes.get(self.path)
                if route is None:
                    self.send_error(404)
                elif callable(route):
                    route(self)
                else:
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(route)))
                    self.end_headers()
                    self.wfile.write(route)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = "http://127.0.0.1:%d/symbols" % self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def serve(self, name, key, file_name, content):
        from urllib.parse import quote
        self.routes["/symbols/%s/%s/%s" % (quote(name, safe=""), key, quote(file_name, safe=""))] = content

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    running = HostileServer()
    symbol_path.FAILED_DOWNLOADS.clear()
    yield running
    running.close()


def locator(cache, server, **limits):
    return SymbolLocator(parse_symbol_path("srv*%s*%s" % (cache, server.url)), limits=Limits(**limits))


def cache_files(cache):
    """Every file and link under the cache, relative to it."""
    found = []
    for root, directories, files in os.walk(str(cache)):
        found.extend(os.path.relpath(os.path.join(root, name), str(cache)) for name in files + [
            directory for directory in directories if os.path.islink(os.path.join(root, directory))])
    return sorted(found)


def test_the_driver_pdb_is_downloaded_into_the_store_layout(tmp_path, server):
    codeview = driver_codeview()
    server.serve(codeview.pdb_name, codeview.symbol_server_key, codeview.pdb_name, read(DRIVER_PDB))
    pdb = locator(tmp_path / "cache", server).find_pdb(codeview, Reports())
    assert pdb is not None and pdb.path == str(tmp_path / "cache" / codeview.pdb_name /
                                               codeview.symbol_server_key / codeview.pdb_name)
    assert cache_files(tmp_path / "cache") == [os.path.join(codeview.pdb_name, codeview.symbol_server_key,
                                                            codeview.pdb_name)]


@pytest.mark.parametrize("name", ["..", "foo\\..", "foo/..", ".", "", "   ", "dir\\", "C:evil.pdb"])
def test_a_pdb_name_that_is_no_file_name_is_refused_before_any_request(tmp_path, server, name):
    cache = tmp_path / "inner" / "cache"
    reports = Reports()
    assert locator(cache, server).find_pdb(driver_codeview(name), reports) is None
    assert server.requests == [] and "refused the PDB name" in reports.text
    assert os.listdir(str(tmp_path)) == []


@pytest.mark.parametrize("name", ["..\\..\\x.pdb", "C:\\evil\\x.pdb", "/abs/x.pdb"])
def test_a_path_in_the_pdb_name_is_reduced_to_its_base_name(tmp_path, server, name):
    codeview = driver_codeview(name)
    server.serve("x.pdb", codeview.symbol_server_key, "x.pdb", read(DRIVER_PDB))
    pdb = locator(tmp_path / "cache", server).find_pdb(codeview, Reports())
    assert pdb is not None and pdb.path.startswith(str(tmp_path / "cache" / "x.pdb"))


@pytest.mark.parametrize("name", ["my driver.pdb", "a?b#c.pdb", "100%.pdb"])
def test_names_with_spaces_and_url_characters_are_percent_encoded(tmp_path, server, name):
    codeview = driver_codeview(name)
    server.serve(name, codeview.symbol_server_key, name, read(DRIVER_PDB))
    pdb = locator(tmp_path / "cache", server).find_pdb(codeview, Reports())
    assert pdb is not None and os.path.basename(pdb.path) == name
    assert " " not in server.requests[0] and "?" not in server.requests[0] and "#" not in server.requests[0]


def trickle(handler, delay=0.1, total=1 << 20):
    handler.send_response(200)
    handler.send_header("Content-Length", str(total))
    handler.end_headers()
    try:
        handler.wfile.write(read(DRIVER_PDB)[:64])
        handler.wfile.flush()
        for _ in range(total):
            time.sleep(delay)
            handler.wfile.write(b"\0")
            handler.wfile.flush()
    except OSError:
        pass  # the client gave up


def test_a_trickle_ends_at_the_overall_deadline(tmp_path, server):
    codeview = driver_codeview()
    server.serve(codeview.pdb_name, codeview.symbol_server_key, codeview.pdb_name, trickle)
    reports = Reports()
    started = time.monotonic()
    assert locator(tmp_path / "cache", server, deadline=1.0, grace=60).find_pdb(codeview, reports) is None
    assert time.monotonic() - started < 10
    assert "past the 1 s deadline" in reports.text
    assert cache_files(tmp_path / "cache") == []


def test_a_trickle_ends_below_the_minimum_rate(tmp_path, server):
    codeview = driver_codeview()
    server.serve(codeview.pdb_name, codeview.symbol_server_key, codeview.pdb_name, trickle)
    reports = Reports()
    assert locator(tmp_path / "cache", server, grace=0.5, minimum_rate=1000).find_pdb(codeview, reports) is None
    assert "slower than the minimum 1000 bytes/s" in reports.text
    assert cache_files(tmp_path / "cache") == []


class Recorder(object):
    """Serves ``body`` announcing ``length`` bytes, and remembers how much of it
    the client took before it hung up."""

    def __init__(self, body, length=None):
        self.body = body
        self.length = len(body) if length is None else length
        self.sent = 0

    def __call__(self, handler):
        handler.send_response(200)
        handler.send_header("Content-Length", str(self.length))
        handler.end_headers()
        try:
            for at in range(0, len(self.body), 1 << 16):
                handler.wfile.write(self.body[at:at + (1 << 16)])
                self.sent = at + (1 << 16)
        except OSError:
            pass


@pytest.mark.parametrize("body, said", [
    (random.Random(24).getrandbits(8 * (8 << 20)).to_bytes(8 << 20, "little"), "is not a PDB: it starts with"),
    (b"  <!DOCTYPE html><html><body>Sign in to continue</body></html>" * 20, "is an HTML page, not a PDB"),
    (b"", "is an empty file, not a PDB"),
    (b"Microsoft C/C++ MSF", "is truncated: 19 bytes"),
])
def test_junk_html_and_empty_bodies_are_refused_for_what_they_are_before_anything_is_written(
        tmp_path, server, body, said):
    codeview = driver_codeview()
    served = Recorder(body)
    server.serve(codeview.pdb_name, codeview.symbol_server_key, codeview.pdb_name, served)
    reports = Reports()
    assert locator(tmp_path / "cache", server).find_pdb(codeview, reports) is None
    assert said in reports.text and "does not match" not in reports.text
    assert cache_files(tmp_path / "cache") == []
    assert served.sent < len(body) or len(body) < (1 << 20)  # 8 MiB of junk is not read to its end


def test_a_body_that_ends_before_its_content_length_is_reported_truncated(tmp_path, server):
    codeview = driver_codeview()
    data = read(DRIVER_PDB)
    server.serve(codeview.pdb_name, codeview.symbol_server_key, codeview.pdb_name,
                 Recorder(data[:len(data) // 2], len(data)))
    reports = Reports()
    assert locator(tmp_path / "cache", server, timeout=2).find_pdb(codeview, reports) is None
    assert "truncated" in reports.text or "IncompleteRead" in reports.text
    assert cache_files(tmp_path / "cache") == []


def test_a_content_length_over_the_cap_is_refused_before_the_body_is_read(tmp_path, server):
    codeview = driver_codeview()
    served = Recorder(read(DRIVER_PDB))
    server.serve(codeview.pdb_name, codeview.symbol_server_key, codeview.pdb_name, served)
    reports = Reports()
    assert locator(tmp_path / "cache", server, max_bytes=100000).find_pdb(codeview, reports) is None
    assert "announces %d bytes, more than the 100000 allowed" % len(read(DRIVER_PDB)) in reports.text
    assert cache_files(tmp_path / "cache") == []


def test_a_pdb_of_another_build_is_reported_and_not_kept(tmp_path, server):
    codeview = driver_codeview()
    server.serve(codeview.pdb_name, codeview.symbol_server_key, codeview.pdb_name, read(OTHER_PDB))
    reports = Reports()
    assert locator(tmp_path / "cache", server).find_pdb(codeview, reports) is None
    assert "is the PDB of another build" in reports.text
    assert cache_files(tmp_path / "cache") == []


def basic32_codeview():
    return PEImage.from_file(os.path.join(CAB, "basic32.dll")).codeview


def test_a_missing_pdb_is_asked_for_as_a_pd_cabinet_and_expanded(tmp_path, server):
    codeview = basic32_codeview()
    server.serve("basic32.pdb", codeview.symbol_server_key, "basic32.pd_", read(os.path.join(CAB, "basic32.pd_")))
    pdb = locator(tmp_path / "cache", server).find_pdb(codeview, Reports())
    assert pdb is not None and pdb.matches(codeview.guid, codeview.age) and len(pdb.procedures()) == 3072
    assert [request.rsplit("/", 1)[-1] for request in server.requests] == ["basic32.pdb", "basic32.pd_"]
    assert cache_files(tmp_path / "cache") == [os.path.join("basic32.pdb", codeview.symbol_server_key,
                                                            "basic32.pdb")]


def test_a_pd_that_is_not_a_cabinet_is_refused(tmp_path, server):
    codeview = basic32_codeview()
    server.serve("basic32.pdb", codeview.symbol_server_key, "basic32.pd_", read(DRIVER_PDB))
    reports = Reports()
    assert locator(tmp_path / "cache", server).find_pdb(codeview, reports) is None
    assert "basic32.pd_ is not a cabinet" in reports.text and cache_files(tmp_path / "cache") == []


def test_file_ptr_is_followed_to_a_url_or_a_file_and_its_message_reported(tmp_path, server):
    codeview = driver_codeview()
    key = codeview.symbol_server_key
    server.routes["/elsewhere/driver.pdb"] = read(DRIVER_PDB)
    server.serve(codeview.pdb_name, key, "file.ptr", ("PATH:%s/elsewhere/driver.pdb\r\n" % server.url.rsplit("/", 1)[0]).encode())
    pdb = locator(tmp_path / "cache", server).find_pdb(codeview, Reports())
    assert pdb is not None and server.requests[-1] == "/elsewhere/driver.pdb"
    symbol_path.FAILED_DOWNLOADS.clear()
    server.serve(codeview.pdb_name, key, "file.ptr", ("PATH:%s" % DRIVER_PDB).encode())
    pdb = locator(tmp_path / "cache2", server).find_pdb(codeview, Reports())
    assert pdb is not None and pdb.path.startswith(str(tmp_path / "cache2"))
    symbol_path.FAILED_DOWNLOADS.clear()
    server.serve(codeview.pdb_name, key, "file.ptr", b"MSG: removed for legal reasons")
    reports = Reports()
    assert locator(tmp_path / "cache3", server).find_pdb(codeview, reports) is None
    assert "the server says: removed for legal reasons" in reports.text


def test_a_redirect_to_a_local_file_is_not_followed(tmp_path, server):
    codeview = driver_codeview()

    def redirect(handler):
        handler.send_response(302)
        handler.send_header("Location", "file://" + DRIVER_PDB)
        handler.end_headers()

    server.serve(codeview.pdb_name, codeview.symbol_server_key, codeview.pdb_name, redirect)
    reports = Reports()
    assert locator(tmp_path / "cache", server).find_pdb(codeview, reports) is None
    assert cache_files(tmp_path / "cache") == []


def test_a_link_planted_in_the_cache_is_not_written_through(tmp_path, server):
    codeview = driver_codeview()
    server.serve(codeview.pdb_name, codeview.symbol_server_key, codeview.pdb_name, read(DRIVER_PDB))
    cache, outside = tmp_path / "cache", tmp_path / "outside"
    cache.mkdir()
    outside.mkdir()
    os.symlink(str(outside), str(cache / codeview.pdb_name))
    reports = Reports()
    assert locator(cache, server).find_pdb(codeview, reports) is None
    assert "outside the symbol cache" in reports.text and os.listdir(str(outside)) == []


def test_a_link_at_the_final_name_is_neither_followed_nor_replaced(tmp_path, server):
    codeview = driver_codeview()
    server.serve(codeview.pdb_name, codeview.symbol_server_key, codeview.pdb_name, read(DRIVER_PDB))
    cache = tmp_path / "cache"
    final = cache / codeview.pdb_name / codeview.symbol_server_key / codeview.pdb_name
    final.parent.mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    os.symlink(str(victim), str(final))
    reports = Reports()
    assert locator(cache, server).find_pdb(codeview, reports) is None
    assert "outside the symbol cache" in reports.text
    assert victim.read_bytes() == b"precious" and os.path.islink(str(final))


DOWNLOADER = """
import sys
sys.path.insert(0, %r)
from dbgext.pe import PEImage
from dbgext.symbols.path import SymbolLocator, parse_symbol_path
codeview = PEImage.from_file(%r).codeview
messages = []
pdb = SymbolLocator(parse_symbol_path(sys.argv[1])).find_pdb(codeview, lambda kind, text: messages.append(text))
print("found" if pdb is not None else "none: %%s" %% messages)
"""


def downloader(cache, server):
    root = os.path.dirname(HERE)
    return subprocess.Popen([sys.executable, "-c", DOWNLOADER % (root, DRIVER_IMAGE),
                             "srv*%s*%s" % (cache, server.url)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def test_six_concurrent_processes_on_one_cache_all_get_the_one_file(tmp_path, server):
    codeview = driver_codeview()
    data = read(DRIVER_PDB)

    def slow(handler):
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        for at in range(0, len(data), 1 << 16):
            time.sleep(0.02)
            handler.wfile.write(data[at:at + (1 << 16)])

    server.serve(codeview.pdb_name, codeview.symbol_server_key, codeview.pdb_name, slow)
    processes = [downloader(tmp_path / "cache", server) for _ in range(6)]
    outputs = [process.communicate(timeout=120) for process in processes]
    assert [out.strip() for out, _ in outputs] == ["found"] * 6, outputs
    assert all(err == "" for _, err in outputs)
    assert cache_files(tmp_path / "cache") == [os.path.join(codeview.pdb_name, codeview.symbol_server_key,
                                                            codeview.pdb_name)]


def test_sigterm_during_a_download_leaves_no_temporary_file(tmp_path, server):
    codeview = driver_codeview()
    server.serve(codeview.pdb_name, codeview.symbol_server_key, codeview.pdb_name, trickle)
    process = downloader(tmp_path / "cache", server)
    key_folder = tmp_path / "cache" / codeview.pdb_name / codeview.symbol_server_key
    deadline = time.monotonic() + 60
    while not (key_folder.is_dir() and os.listdir(str(key_folder))) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert os.listdir(str(key_folder)), "the download never started"
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=60)
    assert process.returncode == -signal.SIGTERM
    assert cache_files(tmp_path / "cache") == []
