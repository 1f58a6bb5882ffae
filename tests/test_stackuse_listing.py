"""``stackuse functions`` without ``--depth`` decodes an x64 body with unwind data
only where its bytes may hold a direct branch to code not yet known as a function
or a `sub rsp` after the prologue: whatever a body holds, the listing is the one
``--depth`` gives (functions, frames, origins, names, problems), minus the depths."""

from dbgext.pe import PEImage
from dbgext.stackuse import analyze
from dbgext.stackuse.fixtures import Function, alloc_slots, build_pe, push_slot

RET = b"\xc3"
PROLOGUE = [b"\x53", b"\x48\x83\xec\x20"]                       # push rbx; sub rsp, 0x20
EPILOGUE = [b"\x48\x83\xc4\x20", b"\x5b"]                       # add rsp, 0x20; pop rbx
UNWIND = {"prolog_size": 5, "slots": alloc_slots(5, 0x20) + push_slot(1, 3)}
DEPTH_FIELDS = ("depth", "depth_bound", "depth_unknown")


def listing_and_depths(functions):
    data = build_pe("x64", functions).data
    listing = analyze(pe=PEImage.from_bytes(data, "test.sys")).as_dict()
    with_depths = analyze(pe=PEImage.from_bytes(data, "test.sys"), depth=True).as_dict()
    for record in with_depths["functions"]:
        for field in DEPTH_FIELDS:
            del record[field]
    return listing, with_depths


def by_name(document, name):
    return [record for record in document["functions"] if record["name"] == name]


def test_leaves_reached_only_by_a_call_or_a_tail_jump_are_listed():
    functions = [Function("caller", PROLOGUE + [("call", "leaf")] + EPILOGUE + [("jmp", "tail")], UNWIND),
                 Function("leaf", [RET], export=False),
                 Function("tail", [b"\x31\xc0", RET], export=False)]
    listing, with_depths = listing_and_depths(functions)
    assert listing == with_depths
    assert sorted(record["found_by"] for record in listing["functions"]) == ["call", "call", "pdata"]


def test_an_allocation_after_the_prologue_is_dynamic():
    body = PROLOGUE + [b"\x48\x29\xc4", b"\x48\x83\xec\x80"] + EPILOGUE + [RET]  # sub rsp, rax; sub rsp, -0x80
    listing, with_depths = listing_and_depths([Function("alloca", body, UNWIND)])
    assert listing == with_depths
    assert by_name(listing, "alloca")[0]["dynamic"] is True


def test_branch_bytes_inside_other_instructions_change_nothing():
    # mov eax, 0xe8e9eb00 / mov rax, imm64 full of E8 and EB bytes: no instruction.
    body = PROLOGUE + [b"\xb8\x00\xeb\xe9\xe8", b"\x48\xb8\xe8\x10\x00\x00\x00\xeb\xfe\x00"] + EPILOGUE + [RET]
    listing, with_depths = listing_and_depths([Function("f", body, UNWIND)])
    assert listing == with_depths
    assert [record["found_by"] for record in listing["functions"]] == ["pdata"]


def test_undecodable_code_is_reported_the_same_way():
    body = PROLOGUE + [b"\x06"] + EPILOGUE + [RET]              # push es: invalid in 64-bit code
    listing, with_depths = listing_and_depths([Function("broken", body, UNWIND)])
    assert listing == with_depths
    assert [problem["kind"] for problem in listing["problems"]] == ["function_not_followed"]


def test_a_chained_fragment_calling_a_leaf_lists_the_leaf():
    parent = Function("parent", PROLOGUE + [("jmp", "cold")] + EPILOGUE + [RET], UNWIND)
    cold = Function("cold", [("call", "leaf")] + EPILOGUE + [RET], {"chain_to": "parent"}, export=False)
    leaf = Function("leaf", [RET], export=False)
    listing, with_depths = listing_and_depths([parent, cold, leaf])
    assert listing == with_depths
    assert len(listing["functions"]) == 3
