"""tierfs.torch (python/tierfs/torch.py): state dicts in the safetensors
layout, on a real tierfs mount and in a plain directory; the file checked
by a strict reader written here (from the backing directory after the
unmount); bad input; torch.distributed.checkpoint where torch has it; CUDA
tensors where CUDA is.  Skipped where torch cannot be imported."""

import collections
import glob
import json
import math
import os
import struct
import subprocess
import sys

import pytest

import util

sys.path.insert(0, os.path.join(util.REPO_DIR, "python"))
torch = pytest.importorskip("torch")
import tierfs  # noqa: E402
import tierfs.torch as tt  # noqa: E402

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
dcp_only = pytest.mark.skipif(not tt.HAVE_DCP, reason=f"no torch.distributed.checkpoint "
                              f"in torch {torch.__version__}")

SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
         "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


# ---------------------------------------------------------------- helpers

class Place:
    def __init__(self, d, m):
        self.dir, self.m = d, m


@pytest.fixture(params=[pytest.param("tierfs", marks=pytest.mark.daemon), "plain"])
def place(request, tmp_path):
    if request.param == "plain":
        d = tmp_path / "plain"
        d.mkdir()
        return Place(str(d), None)
    m = request.getfixturevalue("mount")(host_cache="64M")
    return Place(m.mnt, m)


def strict_read(path):
    """A safetensors reader as strict as the reference one: returns
    (metadata, {name: (dtype, shape, bytes)})."""
    with open(path, "rb") as f:
        data = f.read()
    assert len(data) >= 8
    n = struct.unpack("<Q", data[:8])[0]
    assert 8 + n <= len(data)
    assert (8 + n) % 8 == 0, "data not 8-aligned"
    text = data[8:8 + n].decode("utf-8")
    assert text.startswith("{")
    hdr = json.loads(text)
    meta = hdr.pop("__metadata__", {})
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items())
    ents = sorted(hdr.items(), key=lambda kv: tuple(kv[1]["data_offsets"]))
    pos, out = 0, {}
    for name, e in ents:
        b, end = e["data_offsets"]
        assert b == pos, f"{name}: gap or overlap at {pos}"
        assert end - b == math.prod(e["shape"]) * SIZES[e["dtype"]], name
        assert b % SIZES[e["dtype"]] == 0, f"{name}: not aligned to its element size"
        out[name] = (e["dtype"], e["shape"], data[8 + n + b:8 + n + end])
        pos = end
    assert pos == len(data) - 8 - n, "bytes after the last tensor"
    return meta, out


def raw(t):
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def assert_equal(a, b, where="root"):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), where
        assert (a.dtype, a.shape, a.device) == (b.dtype, b.shape, b.device), where
        assert raw(a) == raw(b), where                  # byte-exact (NaNs too)
    elif isinstance(a, dict):
        assert type(a) is type(b) and list(a) == list(b), where
        for k in a:
            assert_equal(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_equal(x, y, f"{where}.{i}")
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b), where
    else:
        assert type(a) is type(b) and a == b, (where, a, b)


def trained(device="cpu", seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16),
                                torch.nn.ReLU(), torch.nn.Linear(16, 2)).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(3):
        loss = model(torch.randn(32, 8, device=device)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model, opt


def mixed(device="cpu"):
    torch.manual_seed(1)
    return {
        "f64": torch.randn(3, 2, dtype=torch.float64, device=device),
        "bf16": torch.randn(5, 7, device=device).to(torch.bfloat16),
        "f16": torch.randn(9, device=device).half(),
        "bool": torch.rand(11, device=device) > 0.5,
        "i64": torch.arange(-3, 4, device=device),
        "i32": torch.arange(6, dtype=torch.int32, device=device).view(2, 3),
        "i16": torch.tensor([-7, 300], dtype=torch.int16, device=device),
        "i8": torch.tensor([-1, 2, -3], dtype=torch.int8, device=device),
        "u8": torch.arange(250, 255, dtype=torch.uint8, device=device),
        "scalar": torch.tensor(2.5, device=device),
        "empty": torch.empty(0, 4, device=device),
        "nan": torch.tensor([float("nan"), float("inf")], device=device),
    }


def state(device="cpu"):
    model, opt = trained(device)
    return {"model": model.state_dict(), "optim": opt.state_dict(), "step": 3,
            "loss": 0.25, "tag": "run-1", "none": None, "flag": True,
            "pair": (1, 2.0, float("nan"), float("-inf")), "blob": b"\x00\xff",
            "size": torch.Size([2, 3]), "mixed": mixed(device),
            7: {1.5: ["a", [1, 2]], (1, "x"): False}}


# ---------------------------------------------------------------- round trips

def test_nested_state_dict_round_trip(place):
    sd = state()
    path = os.path.join(place.dir, "ck.safetensors")
    tt.save(sd, path)
    back = tt.load(path)
    assert_equal(sd, back)
    assert back["model"]._metadata == sd["model"]._metadata   # module versions kept
    assert isinstance(back["optim"]["state"], dict) and 0 in back["optim"]["state"]
    # optimizer state loads into a fresh optimizer and steps the same
    model2, opt2 = trained(seed=5)
    model2.load_state_dict(back["model"])
    opt2.load_state_dict(back["optim"])
    assert_equal(opt2.state_dict(), sd["optim"])

    meta, ents = strict_read(path)
    assert meta["format"] == "pt" and json.loads(meta[tt.STRUCTURE_KEY])["version"] == 1
    assert ents["model.0.weight"][2] == raw(sd["model"]["0.weight"])
    assert ents["optim.state.0.exp_avg"][2] == raw(sd["optim"]["state"][0]["exp_avg"])
    assert ents["mixed.bf16"][:2] == ("BF16", [5, 7])
    assert ents["mixed.bool"][:2] == ("BOOL", [11])
    assert ents["mixed.scalar"][:2] == ("F32", [])
    for k, t in sd["mixed"].items():
        assert ents[f"mixed.{k}"][2] == raw(t), k
    if place.m is not None:                             # the same bytes in the backing dir
        with open(path, "rb") as f:
            on_mount = f.read()
        place.m.umount()
        backing = os.path.join(place.m.backing, "ck.safetensors")
        with open(backing, "rb") as f:
            assert f.read() == on_mount
        assert strict_read(backing) == (meta, ents)
        assert_equal(sd, tt.load(backing))


def test_flat_model_state_dict_keeps_its_names(place):
    model, _ = trained()
    sd = model.state_dict()
    path = os.path.join(place.dir, "model.safetensors")
    tt.save(sd, path)
    _, ents = strict_read(path)
    assert set(ents) == set(sd)
    back = tt.load(path)
    assert type(back) is collections.OrderedDict and list(back) == list(sd)
    assert_equal(sd, back)


def test_other_writers_file_loads_flat(tmp_path):
    """A safetensors file without tierfs's structure: {name: tensor}."""
    a = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    b = torch.tensor([1, 2], dtype=torch.int64)
    path = tmp_path / "x.safetensors"
    path.write_bytes(make_file({"b": ("I64", [2], [0, 16]), "a": ("F32", [2, 3], [16, 40])},
                               raw(b) + raw(a), meta={"format": "pt"}))
    back = tt.load(str(path))
    assert list(back) == ["b", "a"]
    assert torch.equal(back["a"], a) and torch.equal(back["b"], b)


def test_load_into_existing_tensors(place):
    model, opt = trained()
    path = os.path.join(place.dir, "ck.safetensors")
    tt.save({"model": model.state_dict(), "optim": opt.state_dict(), "epoch": 4}, path)

    model2, _ = trained(seed=9)
    opt2 = torch.optim.Adam(model2.parameters(), lr=0.5)       # fresh: empty state
    w = model2[0].weight
    ptr = w.data_ptr()
    into = {"model": model2.state_dict(), "optim": opt2.state_dict()}
    got = tt.load(path, into=into)
    assert got is into and got["epoch"] == 4
    assert model2[0].weight is w and w.data_ptr() == ptr      # copied in place
    assert_equal(model.state_dict(), model2.state_dict())
    opt2.load_state_dict(into["optim"])
    assert opt2.param_groups[0]["lr"] == 1e-2
    assert_equal(opt.state_dict(), opt2.state_dict())

    # an optimizer that has state already: its tensors are refilled in place
    model3, opt3 = trained(seed=3)
    sd3 = opt3.state_dict()
    buf = sd3["state"][0]["exp_avg"]
    tt.load(path, into={"model": model3.state_dict(), "optim": sd3})
    assert sd3["state"][0]["exp_avg"] is buf
    assert torch.equal(buf, opt.state_dict()["state"][0]["exp_avg"])


def test_load_into_mismatches_change_nothing(tmp_path):
    path = str(tmp_path / "ck.safetensors")
    model, _ = trained()
    tt.save(model.state_dict(), path)

    def fresh():
        m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16),
                                torch.nn.ReLU(), torch.nn.Linear(16, 2))
        return m, [raw(t) for t in m.state_dict().values()]

    wide, before = fresh()
    sd = wide.state_dict()
    sd["3.weight"] = torch.zeros(3, 16)                         # shape
    with pytest.raises(tt.MismatchError, match=r"3\.weight.*shape"):
        tt.load(path, into=sd)
    assert [raw(t) for t in wide.state_dict().values()] == before

    m, before = fresh()
    sd = m.state_dict()
    sd["0.bias"] = torch.zeros(16, dtype=torch.float64)          # dtype
    with pytest.raises(tt.MismatchError, match=r"0\.bias.*dtype"):
        tt.load(path, into=sd)
    assert [raw(t) for t in m.state_dict().values()] == before

    m, before = fresh()
    sd = m.state_dict()
    sd["extra"] = torch.zeros(2)                                 # strict
    with pytest.raises(tt.MismatchError, match="extra"):
        tt.load(path, into=sd)
    assert [raw(t) for t in m.state_dict().values()] == before
    tt.load(path, into=sd, strict=False)
    assert_equal(model.state_dict()["0.weight"], sd["0.weight"])

    with pytest.raises(tt.MismatchError, match="0.weight"):
        tt.load(path, into={"0.weight": [1, 2]})
    assert issubclass(tt.MismatchError, ValueError)


def test_repeated_loads_into_one_object_see_its_changes(place):
    """A load into an object loaded into before walks it ahead, against the
    structure of its last file: what the object became since, and a file of
    another structure, must still be seen."""
    a = os.path.join(place.dir, "a.safetensors")
    b = os.path.join(place.dir, "b.safetensors")
    tt.save({"w": torch.arange(6.0), "n": 1, "s": torch.tensor(2.0)}, a)
    tt.save({"w": torch.arange(6.0) * 2, "other": torch.ones(3)}, b)
    into = {"w": torch.zeros(6), "n": 0, "s": torch.zeros(())}
    for _ in range(3):                  # the second and third walk ahead
        assert tt.load(a, into=into) is into and into["n"] == 1
    assert torch.equal(into["w"], torch.arange(6.0)) and into["s"].item() == 2.0

    into["w"] = torch.zeros(5)          # changed since the last load: refused
    with pytest.raises(tt.MismatchError, match=r"w: the file has shape \[6\]"):
        tt.load(a, into=into)
    assert torch.equal(into["w"], torch.zeros(5))
    fresh = into["w"] = torch.zeros(6)  # a new tensor in the slot: filled, not the old one
    tt.load(a, into=into)
    assert into["w"] is fresh and torch.equal(fresh, torch.arange(6.0))

    with pytest.raises(tt.MismatchError, match="s: in `into`, not in the file"):
        tt.load(b, into=into)           # another file, another walk
    got = tt.load(b, into={"w": torch.zeros(6), "other": torch.zeros(3)})
    assert torch.equal(got["w"], torch.arange(6.0) * 2)
    assert torch.equal(tt.load(a, into=into)["w"], torch.arange(6.0))


def test_host_tensors_after_the_header_are_read_with_it(place):
    """save() puts host tensors right after the header; a load takes those
    that lie in the header's read from it, and reads the rest, exactly."""
    g = torch.Generator().manual_seed(5)
    small = {f"s{i}": torch.randn(3, generator=g) for i in range(20)}
    big = torch.randn(40000, generator=g)         # 160 KB: past the first read
    sd = {"small": small, "big": big, "i": torch.arange(7)}
    path = os.path.join(place.dir, "h.safetensors")
    tt.save(sd, path)
    before = tt.io_stats.get("host_from_header", 0)
    got = tt.load(path)
    assert_equal(sd, got)
    assert tt.io_stats["host_from_header"] > before
    into = {"small": {k: torch.zeros(3) for k in small}, "big": torch.zeros(40000),
            "i": torch.zeros(7, dtype=torch.int64)}
    tt.load(path, into=into)
    assert_equal(sd, into)


def test_shared_storage_written_once(place):
    base = torch.arange(1000, dtype=torch.float32)
    path = os.path.join(place.dir, "tied.safetensors")
    tt.save({"a": base, "b": base, "enc.w": base.view(10, 100)}, path)
    # "a" and "b": one tensor; "enc.w" another view: one span of the storage
    _, ents = strict_read(path)
    assert sum(len(e[2]) for e in ents.values()) == 4000
    back = tt.load(path)
    assert back["a"] is back["b"]                              # tied: one object
    assert back["enc.w"].data_ptr() == back["a"].data_ptr()    # a view of one storage
    back["a"][5] = -1
    assert back["enc.w"][0, 5] == -1

    tied = {"x": base, "y": base}                              # identical views only
    tt.save(tied, path)
    _, ents = strict_read(path)
    assert list(ents) == ["x"] and len(ents["x"][2]) == 4000
    back = tt.load(path)
    assert back["x"] is back["y"]

    lin = torch.nn.Linear(4, 4)
    m = torch.nn.ModuleDict({"enc": lin, "dec": lin})           # tied modules
    tt.save(m.state_dict(), path)
    assert os.path.getsize(path) < 2 * 16 * 4 + 1024
    back = tt.load(path)
    assert back["enc.weight"] is back["dec.weight"]

    parts = torch.arange(20.)
    tt.save({"lo": parts[:5], "hi": parts[15:], "mid": parts.view(4, 5)[:, 2]}, path)
    back = tt.load(path)
    assert torch.equal(back["lo"], parts[:5]) and torch.equal(back["hi"], parts[15:])
    assert torch.equal(back["mid"], parts.view(4, 5)[:, 2])
    assert back["mid"].stride() == (5,)
    assert back["hi"].data_ptr() - back["lo"].data_ptr() == 15 * 4


def test_non_contiguous_saved_as_contiguous_copy(tmp_path):
    t = torch.randn(6, 4).t()
    path = str(tmp_path / "nc.safetensors")
    tt.save({"t": t, "col": torch.randn(5, 5)[:, 1]}, path)
    _, ents = strict_read(path)
    assert ents["t"][:2] == ("F32", [4, 6]) and ents["t"][2] == raw(t)
    back = tt.load(path)
    assert torch.equal(back["t"], t) and back["t"].is_contiguous()


def test_map_location_and_saved_device(tmp_path):
    path = str(tmp_path / "m.safetensors")
    tt.save({"a": torch.ones(3)}, path)
    assert tt.load(path)["a"].device.type == "cpu"
    assert tt.load(path, map_location="cpu")["a"].device.type == "cpu"
    assert tt.load(path, map_location={"cpu": "cpu"})["a"].device.type == "cpu"
    with pytest.raises(TypeError):
        tt.load(path, map_location=lambda s, loc: s)


# ---------------------------------------------------------------- bad input

def make_file(entries, data, meta=None, pad=True, raw_header=None):
    hdr = {}
    if meta is not None:
        hdr["__metadata__"] = meta
    for name, (dt, shape, offs) in entries.items():
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": offs}
    text = raw_header if raw_header is not None else json.dumps(hdr).encode()
    if pad:
        text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


@pytest.mark.parametrize("what", ["complex", "object", "set-key"])
def test_unsupported_input_raises_type_error_and_writes_nothing(tmp_path, what):
    bad = {"complex": {"w": torch.zeros(2, dtype=torch.complex64)},
           "object": {"w": {1, 2}},
           "set-key": {frozenset([1]): 1}}[what]
    path = tmp_path / "x.safetensors"
    with pytest.raises(TypeError) as ei:
        tt.save({"ok": torch.ones(2), "mid": bad, "z": torch.ones(1)}, str(path))
    assert "mid" in str(ei.value)
    assert os.listdir(tmp_path) == []


def test_failed_save_leaves_previous_file(place, monkeypatch):
    path = os.path.join(place.dir, "ck.safetensors")
    tt.save({"w": torch.arange(100.)}, path)
    with open(path, "rb") as f:
        before = f.read()
    with pytest.raises(TypeError, match="complex"):
        tt.save({"w": torch.zeros(100), "bad": torch.zeros(3, dtype=torch.complex64),
                 "z": torch.ones(4)}, path)
    with open(path, "rb") as f:
        assert f.read() == before

    def broken(fd, *args):                          # an I/O error in the middle
        os.write(fd, b"partial")
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(tt, "_write_tensors", broken)
    monkeypatch.setattr(tt, "_write_plan_host", broken)  # a save like an earlier one
    with pytest.raises(OSError, match="No space"):
        tt.save({"w": torch.zeros(100)}, path)
    with open(path, "rb") as f:
        assert f.read() == before
    assert os.listdir(place.dir) == ["ck.safetensors"]     # no temporary left


def good_bytes():
    a = torch.arange(4, dtype=torch.float32)
    return raw(a)


@pytest.mark.parametrize("name, content, match", [
    ("empty", b"", "not a safetensors"),
    ("short", b"\x01\x02", "not a safetensors"),
    ("text", b"hello world, this is not a tensor file\n", "header"),
    ("pickle", b"PK\x03\x04" + b"\x00" * 60, "header"),
    ("not-json", make_file({}, b"", raw_header=b"{nope"), "not JSON"),
    ("not-object", make_file({}, b"", raw_header=b"[1, 2]"), "not JSON|object"),
    ("huge-header", struct.pack("<Q", 1 << 40) + b"{}", "over"),
    ("truncated-header", make_file({"a": ("F32", [4], [0, 16])}, good_bytes())[:20],
     "truncated|header"),
    ("truncated-data", make_file({"a": ("F32", [4], [0, 16])}, good_bytes())[:-1],
     "truncated|past"),
    ("trailing", make_file({"a": ("F32", [4], [0, 16])}, good_bytes() + b"xx"), "cover"),
    ("overlap", make_file({"a": ("F32", [4], [0, 16]), "b": ("F32", [2], [8, 16])},
                          good_bytes()), "overlap"),
    ("gap", make_file({"a": ("F32", [2], [0, 8]), "b": ("F32", [1], [12, 16])},
                      good_bytes()), "gap"),
    ("outside", make_file({"a": ("F32", [4], [100, 116])}, good_bytes()), "gap|past"),
    ("size", make_file({"a": ("F32", [3], [0, 16])}, good_bytes()), "needs 12"),
    ("backwards", make_file({"a": ("F32", [0], [16, 0])}, good_bytes()), "begin, end"),
    ("dtype", make_file({"a": ("F17", [4], [0, 16])}, good_bytes()), "unknown dtype"),
    ("shape", make_file({"a": ("F32", [-4], [0, 16])}, good_bytes()), "shape"),
    ("fields", make_file({}, b"", raw_header=b'{"a":{"dtype":"F32","shape":[0]}}'),
     "exactly"),
    ("duplicate", make_file({}, good_bytes(), raw_header=(
        b'{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},'
        b'"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}')), "twice"),
    ("metadata", make_file({}, b"", meta={"x": 1}), "strings"),
    ("structure-json", make_file({"a": ("F32", [4], [0, 16])}, good_bytes(),
                                 meta={"tierfs.structure": "{"}), "not JSON"),
    ("structure-ref", make_file({"a": ("F32", [4], [0, 16])}, good_bytes(), meta={
        "tierfs.structure": json.dumps({"version": 1, "root": {"tensor": "zz"}})}),
     "no tensor"),
    ("structure-view", make_file({"a": ("F32", [4], [0, 16])}, good_bytes(), meta={
        "tierfs.structure": json.dumps({"version": 1, "root": {
            "view": "a", "offset": 2, "shape": [3], "stride": [1]}})}), "past"),
    ("structure-version", make_file({"a": ("F32", [4], [0, 16])}, good_bytes(), meta={
        "tierfs.structure": json.dumps({"version": 99, "root": None})}), "version"),
])
def test_bad_files_raise_format_error(tmp_path, name, content, match):
    path = tmp_path / f"{name}.safetensors"
    path.write_bytes(content)
    with pytest.raises(tt.FormatError, match=match) as ei:
        tt.load(str(path))
    assert isinstance(ei.value, ValueError)


def test_a_good_handmade_file_loads(tmp_path):
    """The bad files above differ from this one in one place each."""
    path = tmp_path / "good.safetensors"
    path.write_bytes(make_file({"a": ("F32", [4], [0, 16])}, good_bytes()))
    assert torch.equal(tt.load(str(path))["a"], torch.arange(4.))


def test_truncated_save_of_ours(tmp_path):
    path = str(tmp_path / "ck.safetensors")
    tt.save(state(), path)
    size = os.path.getsize(path)
    for cut in (size - 1, size // 2, 9):
        with open(path, "r+b") as f:
            f.truncate(cut)
        with pytest.raises(tt.FormatError):
            tt.load(path)


# ---------------------------------------------------------------- packaging

def test_import_tierfs_does_not_import_torch():
    code = ("import sys; sys.path.insert(0, %r); import tierfs, tierfs.statview; "
            "print('torch' in sys.modules)") % os.path.join(util.REPO_DIR, "python")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


def test_dtypes_table():
    for dt in (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64,
               torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool):
        assert dt in tt.DTYPES
    if hasattr(torch, "float8_e4m3fn"):
        assert tt.DTYPES[torch.float8_e4m3fn] == "F8_E4M3"


@pytest.mark.skipif(not hasattr(torch, "float8_e4m3fn"), reason="no float8 in this torch")
def test_float8_round_trip(tmp_path):
    t = torch.randn(16).to(torch.float8_e4m3fn)
    u = torch.randn(16).to(torch.float8_e5m2)
    path = str(tmp_path / "f8.safetensors")
    tt.save({"t": t, "u": u}, path)
    _, ents = strict_read(path)
    assert ents["t"][0] == "F8_E4M3" and ents["u"][0] == "F8_E5M2"
    back = tt.load(path)
    assert raw(back["t"]) == raw(t) and raw(back["u"]) == raw(u)


# ---------------------------------------------------------------- DCP

@pytest.mark.skipif(tt.HAVE_DCP, reason="this torch has torch.distributed.checkpoint")
def test_dcp_classes_raise_clearly_without_dcp(tmp_path):
    for cls in (tt.FileSystemWriter, tt.FileSystemReader):
        with pytest.raises(RuntimeError, match="torch >= 2.0"):
            cls(str(tmp_path))


def _dcp_state(device="cpu"):
    model, opt = trained(device)
    return {"model": model.state_dict(), "step": torch.tensor(3), "extra": {"lr": 0.5},
            "mixed": {k: v for k, v in mixed(device).items() if k not in ("nan", "empty")}}


def _zeros_like(sd):
    if isinstance(sd, torch.Tensor):
        return torch.zeros_like(sd)
    if isinstance(sd, dict):
        return type(sd)((k, _zeros_like(v)) for k, v in sd.items())
    return sd


@dcp_only
@pytest.mark.parametrize("how", ["save", "async_save"])
def test_dcp_round_trip(place, how):
    import torch.distributed.checkpoint as dcp
    if how == "async_save" and not hasattr(dcp, "async_save"):
        pytest.skip("no dcp.async_save in this torch")
    sd = _dcp_state()
    d = os.path.join(place.dir, "dcp")
    w = tt.FileSystemWriter(d)
    if how == "save":
        dcp.save(sd, storage_writer=w)
    else:
        dcp.async_save(sd, storage_writer=w).result()
    files = sorted(f for f in os.listdir(d) if f.endswith(".distcp"))
    assert files
    for f in files:                         # each data file: safetensors
        meta, ents = strict_read(os.path.join(d, f))
        assert meta["format"] == "tierfs.dcp"
        assert ents["model.0.weight"][2] == raw(sd["model"]["0.weight"])
    target = _zeros_like(sd)
    dcp.load(target, storage_reader=tt.FileSystemReader(d))
    assert_equal(sd, target)


@dcp_only
@pytest.mark.daemon
def test_dcp_writer_keeps_a_big_checkpoint_in_the_cache(mount):
    """The writer puts the tensors in first and the header and the
    non-tensor items after them: written the other way round, the items at
    the file's far end left a hole of the tensors' size, and tierfs writes
    a file with such a hole through to the backing directory (2.2 s instead
    of 24 ms for 3.9 GiB on an H200)."""
    import torch.distributed.checkpoint as dcp
    m = mount(host_cache="256M")
    g = torch.Generator().manual_seed(11)
    sd = {"w": torch.randn(12 << 20, generator=g), "step": 7, "names": ["a", "b"]}
    d = os.path.join(m.mnt, "dcp")
    before = tierfs.stats(m.mnt)["ssd"]["bytes_written_through"]
    dcp.save(sd, storage_writer=tt.FileSystemWriter(d))
    assert tierfs.stats(m.mnt)["ssd"]["bytes_written_through"] == before
    target = {"w": torch.zeros(12 << 20), "step": 0, "names": []}
    dcp.load(target, storage_reader=tt.FileSystemReader(d))
    assert torch.equal(target["w"], sd["w"]) and target["step"] == 7


@dcp_only
def test_dcp_reader_reads_torchs_own_checkpoints(tmp_path):
    import torch.distributed.checkpoint as dcp
    sd = _dcp_state()
    d = str(tmp_path / "stock")
    dcp.save(sd, storage_writer=dcp.FileSystemWriter(d))
    target = _zeros_like(sd)
    dcp.load(target, storage_reader=tt.FileSystemReader(d))
    assert_equal(sd, target)


# ---------------------------------------------------------------- CUDA

def _libtierfs(monkeypatch):
    lib = glob.glob(os.path.join(os.path.dirname(util.tierfs_bin()), ".libs", "libtierfs.so.*"))
    if lib:
        monkeypatch.setenv("TIERFS_LIB", sorted(lib)[0])
        monkeypatch.setattr(tierfs, "_lib", None)


@cuda
def test_cuda_plain_directory_through_host_memory(tmp_path):
    sd = state("cuda")
    path = str(tmp_path / "ck.safetensors")
    before = dict(tt.io_stats)
    tt.save(sd, path)
    assert tt.io_stats["gpu_write"] == before.get("gpu_write", 0)   # not tierfs: POSIX
    back = tt.load(path)
    assert back["model"]["0.weight"].is_cuda
    assert_equal(sd, back)
    cpu = tt.load(path, map_location="cpu")
    assert not cpu["model"]["0.weight"].is_cuda
    _, ents = strict_read(path)
    assert ents["model.0.weight"][2] == raw(sd["model"]["0.weight"])
    model, opt = trained("cuda", seed=4)
    into = {"model": model.state_dict(), "optim": opt.state_dict()}
    tt.load(path, into=into, strict=False)
    assert_equal(sd["model"], model.state_dict())


# ---------------------------------------------------------------- repeated saves

def _plans_used():
    return tt.io_stats["saves_from_plan"], tt.io_stats["headers_reused"]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[cuda, pytest.mark.gpu])])
def test_repeated_saves_reuse_their_plan_and_stay_exact(mount, monkeypatch, device):
    """A training loop: the same state dict saved again after each step
    (tensors changed in place) reuses the first save's plan, and every file
    is what a fresh save writes; anything the layout depends on (a value, a
    tensor replaced, reshaped or made non-contiguous, -0.0 for 0.0) makes a
    new plan, never a file with the old value.  Loads reuse a checked
    header they have seen, never for a file of another size."""
    _libtierfs(monkeypatch)
    opts = {"host_cache": "128M"}
    if device == "cuda":
        opts.update(gpu=util.GPU or "0", gpu_cache="128M")
    m = mount(**opts)
    model, opt = trained(device)
    sd = {"model": model.state_dict(), "optim": opt.state_dict(), "step": 1, "lr": 0.0}
    path = os.path.join(m.mnt, "ck.st")
    plain = os.path.join(m.backing, "..", "fresh.st")       # off the mount: no plan

    def check(where):
        tt.save(sd, plain)
        with open(path, "rb") as f, open(plain, "rb") as g:
            assert f.read() == g.read(), where
        assert_equal(sd, tt.load(path), where)

    s0, l0 = _plans_used()
    tt.save(sd, path)                    # makes the plan
    check("first")
    for k in range(3):
        with torch.no_grad():
            for t in model.parameters():
                t.add_(1.0)
        tt.save(sd, path)
        check(f"step {k}")
    assert _plans_used()[0] - s0 == 3
    changes = [
        ("a value", lambda: sd.__setitem__("step", 2)),
        ("a float's sign", lambda: sd.__setitem__("lr", -0.0)),
        ("a tensor replaced", lambda: sd["model"].__setitem__(
            "0.weight", torch.randn(16, 8, device=device))),
        ("a tensor reshaped", lambda: sd["model"].__setitem__(
            "0.bias", sd["model"]["0.bias"].view(4, 4))),
        ("a key added", lambda: sd.__setitem__("extra", torch.ones(3, device=device))),
    ]
    for what, change in changes:
        before, missed = _plans_used()[0], tt.io_stats["plans_missed"]
        change()
        tt.save(sd, path)
        assert _plans_used()[0] == before, what          # not from a plan
        # it guessed the object's last plan (its GPU calls ran while the
        # fingerprint was taken), then started its file again
        assert tt.io_stats["plans_missed"] == missed + 1, what
        check(what)
        tt.save(sd, path)                                 # its own plan now
        assert _plans_used()[0] == before + 1, what
        check(what + ", again")
    sd["model"]["0.weight"] = sd["model"]["0.weight"].t()  # not contiguous: no plan
    before, missed = _plans_used()[0], tt.io_stats["plans_missed"]
    tt.save(sd, path)
    tt.save(sd, path)
    assert _plans_used()[0] == before
    assert tt.io_stats["plans_missed"] == missed + 1     # no second guess
    check("non-contiguous")

    # loads: a header seen before is not parsed and checked again, and a
    # file with it still loads exactly, into the same tensors or new ones
    into = {"model": model.state_dict(), "optim": opt.state_dict()}
    tt.save(into, path)
    want = {"model": collections.OrderedDict((k, v.clone()) for k, v in into["model"].items())}
    r0 = tt.io_stats["headers_reused"]
    for k in range(3):
        with torch.no_grad():
            for t in model.parameters():
                t.zero_()
        assert tt.load(path, into=into) is into
        assert_equal(want["model"], into["model"], f"load {k}")
        assert_equal(want["model"], tt.load(path)["model"], f"fresh load {k}")
    assert tt.io_stats["headers_reused"] - r0 >= 5
    # another header (a value changed) is checked afresh and loads its value
    into["optim"]["param_groups"][0]["lr"] = 0.5
    tt.save(into, path)
    into["optim"]["param_groups"][0]["lr"] = 0.01
    r1 = tt.io_stats["headers_reused"]
    tt.load(path, into=into)
    assert tt.io_stats["headers_reused"] == r1 and into["optim"]["param_groups"][0]["lr"] == 0.5
    # the same header, a file of another size: checked afresh (truncated)
    tt.load(path, into=into)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 4)
    with pytest.raises(tt.FormatError):
        tt.load(path, into=into)


@cuda
@pytest.mark.gpu
def test_cuda_tensors_device_to_device_on_a_gpu_tier(mount, monkeypatch):
    _libtierfs(monkeypatch)
    m = mount(gpu_cache="256M", host_cache="256M")
    sd = state("cuda")
    sd["big"] = torch.randn(4 << 20, device="cuda")                # 16 MiB
    path = os.path.join(m.mnt, "ck.safetensors")
    before = collections.Counter(tt.io_stats)
    tt.save(sd, path)
    back = tt.load(path)
    assert_equal(sd, back)
    model, opt = trained("cuda", seed=4)
    w = model[0].weight
    into = {"model": model.state_dict(), "optim": opt.state_dict()}
    tt.load(path, into=into, strict=False)
    assert model[0].weight is w and torch.equal(w, sd["model"]["0.weight"])
    moved = collections.Counter(tt.io_stats)
    moved.subtract(before)
    if hasattr(tierfs, "pwritev_gpu") and os.environ.get("TIERFS_LIB"):
        assert moved["gpu_write"] >= 16 << 20, moved
        assert moved["gpu_read"] >= 2 * (16 << 20), moved
    tierfs.wait_flushed(path, timeout=120)
    with open(path, "rb") as f:
        on_mount = f.read()
    m.umount()
    backing = os.path.join(m.backing, "ck.safetensors")
    with open(backing, "rb") as f:
        assert f.read() == on_mount
    _, ents = strict_read(backing)
    assert ents["big"][2] == raw(sd["big"])


@cuda
@dcp_only
@pytest.mark.gpu
def test_dcp_cuda_on_a_gpu_tier(mount, monkeypatch):
    import torch.distributed.checkpoint as dcp
    _libtierfs(monkeypatch)
    m = mount(gpu_cache="256M", host_cache="256M")
    sd = _dcp_state("cuda")
    d = os.path.join(m.mnt, "dcp")
    before = collections.Counter(tt.io_stats)
    dcp.save(sd, storage_writer=tt.FileSystemWriter(d))
    target = _zeros_like(sd)
    dcp.load(target, storage_reader=tt.FileSystemReader(d))
    assert_equal(sd, target)
    if hasattr(dcp, "async_save"):
        d2 = os.path.join(m.mnt, "dcp-async")
        dcp.async_save(sd, storage_writer=tt.FileSystemWriter(d2)).result()
        target = _zeros_like(sd)
        dcp.load(target, storage_reader=tt.FileSystemReader(d2))
        assert_equal(sd, target)
    moved = collections.Counter(tt.io_stats)
    moved.subtract(before)
    if hasattr(tierfs, "pwritev_gpu") and os.environ.get("TIERFS_LIB"):
        assert moved["gpu_write"] > 0 and moved["gpu_read"] > 0, moved


_KILLED_WRITER = r"""
import os, signal, sys
sys.path[:0] = [sys.argv[3]]
import torch, tierfs.torch as tt
torch.manual_seed(11)
dev = sys.argv[2]
sd = {"w": torch.randn(256, 1024, device=dev), "b": torch.randn(1024, device=dev).half(),
      "step": torch.tensor(5), "opt": {"state": {0: {"m": torch.randn(64, device=dev)}},
                                       "lr": 0.1}}
tt.save(sd, sys.argv[1])
torch.save(sd, sys.argv[4])                 # the reference, off the mount
print("saved", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[cuda, pytest.mark.gpu])])
def test_reload_after_the_training_process_is_killed(mount, monkeypatch, tmp_path, device):
    """A training process saves and dies by SIGKILL; a new process loads the
    checkpoint back from the mount (the cache lives in the daemon: with a
    GPU tier, device to device from the GPU cache), equal to what was saved."""
    _libtierfs(monkeypatch)
    opts = {"host_cache": "256M"}
    if device == "cuda":
        opts.update(gpu=util.GPU or "0", gpu_cache="256M")
    m = mount(**opts)
    path = os.path.join(m.mnt, "ck.safetensors")
    ref = str(tmp_path / "ref.pt")
    script = tmp_path / "writer.py"
    script.write_text(_KILLED_WRITER)
    pkg = os.path.join(util.REPO_DIR, "python")
    r = subprocess.run([sys.executable, str(script), path, device, pkg, ref],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == -9 and "saved" in r.stdout, (r.returncode, r.stdout, r.stderr)
    want = torch.load(ref)              # each tensor where it was saved (step: CPU)
    before = collections.Counter(tt.io_stats)
    got = tt.load(path)
    assert_equal(want, got)
    into = {"w": torch.zeros_like(want["w"]), "b": torch.zeros_like(want["b"]),
            "step": torch.zeros_like(want["step"]),
            "opt": {"state": {0: {"m": torch.zeros_like(want["opt"]["state"][0]["m"])}},
                    "lr": 0.0}}
    w = into["w"]
    got = tt.load(path, into=into)
    assert got["w"] is w and torch.equal(w, want["w"])
    moved = collections.Counter(tt.io_stats)
    moved.subtract(before)
    if device == "cuda" and hasattr(tierfs, "preadv_gpu") and os.environ.get("TIERFS_LIB"):
        assert moved["gpu_read"] > 0, moved
