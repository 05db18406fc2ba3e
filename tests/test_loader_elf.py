"""Reading a shared object's dynamic section without loading it (acl_swiglu/_elf.py): DT_NEEDED,
DT_SONAME, DT_RPATH / DT_RUNPATH and whether a symbol is exported, against libraries built here
with known answers, and malformed files refused with an ElfError naming the file."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from acl_swiglu._elf import ElfError, SharedObject

SOURCE = r"""
int exported_function(void) { return 1; }
int exported_data = 2;
__attribute__((weak)) int weak_function(void) { return 3; }
__attribute__((visibility("hidden"))) int hidden_function(void) { return 4; }
static int local_function(void) { return 5; }
extern int imported_function(void);
int calls(void) { return local_function() + imported_function(); }
"""
EXPORTED = ("exported_function", "exported_data", "weak_function", "calls")
NOT_EXPORTED = ("hidden_function", "local_function", "imported_function", "no_such_symbol", "")


def _build(out: Path, name: str, *flags: str) -> Path:
    gcc = shutil.which("gcc")
    assert gcc, "gcc is required to build the test libraries"
    src = out / "lib.c"
    src.write_text(SOURCE)
    lib = out / name
    done = subprocess.run([gcc, "-shared", "-fPIC", str(src), "-o", str(lib), *flags], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return lib


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("elf")
    dep = _build(out, "libdep.so", "-Wl,-soname,libdep.so.3")
    libs = {
        "gnu": _build(out, "libgnu.so", "-Wl,--hash-style=gnu", "-Wl,-soname,libgnu.so.1", f"-L{out}",
                      "-Wl,--no-as-needed", "-ldep", "-Wl,-rpath,$ORIGIN:/opt/lib", "-Wl,--enable-new-dtags"),
        "sysv": _build(out, "libsysv.so", "-Wl,--hash-style=sysv", f"-L{out}", "-Wl,--no-as-needed", "-ldep",
                       "-Wl,-rpath,${ORIGIN}/../lib64", "-Wl,--disable-new-dtags"),
        "plain": _build(out, "libplain.so"),
    }
    assert dep.is_file()
    return libs


def _read(path: Path):
    """The object's fields and, for each symbol of the test source, whether it is exported."""
    fd = os.open(path, os.O_RDONLY)
    try:
        shared = SharedObject(fd, str(path))
        return shared, {name: shared.defines(name) for name in EXPORTED + NOT_EXPORTED}
    finally:
        os.close(fd)


def test_the_dynamic_section_of_a_library_with_runpath(built):
    shared, _ = _read(built["gnu"])
    assert shared.soname == "libgnu.so.1"
    assert shared.needed[0] == "libdep.so.3"   # named by the dependency's DT_SONAME
    assert shared.runpath == ("$ORIGIN", "/opt/lib") and shared.rpath == ()


def test_the_dynamic_section_of_a_library_with_rpath(built):
    shared, _ = _read(built["sysv"])
    assert shared.soname is None
    assert "libdep.so.3" in shared.needed
    assert shared.rpath == ("${ORIGIN}/../lib64",) and shared.runpath == ()


@pytest.mark.parametrize("kind", ["gnu", "sysv", "plain"])
def test_exported_symbols_are_found_through_either_hash_table(built, kind):
    _, symbols = _read(built[kind])
    assert {name: symbols[name] for name in EXPORTED} == {name: True for name in EXPORTED}
    assert {name: symbols[name] for name in NOT_EXPORTED} == {name: False for name in NOT_EXPORTED}


def _elf_header(cls: int = 2, data: int = 1, e_type: int = 3, phoff: int = 64, phnum: int = 0) -> bytes:
    ident = b"\x7fELF" + bytes([cls, data, 1]) + bytes(9)
    return struct.pack("<16sHHIQQQIHHHHHH", ident, e_type, 62, 1, 0, phoff, 0, 0, 64, 56, phnum, 64, 0, 0)


@pytest.mark.parametrize("content,reason", [
    (b"", "truncated"),
    (b"not a shared object at all, but long enough to hold an ELF header: " + bytes(64), "is not an ELF file"),
    (_elf_header(cls=1), "is not a 64-bit little-endian ELF object"),
    (_elf_header(data=2), "is not a 64-bit little-endian ELF object"),
    (_elf_header(e_type=2), "is not a shared object (ELF type 2)"),
    (_elf_header(phnum=3), "truncated"),                         # program headers past the end
    (_elf_header(phoff=1 << 40, phnum=1), "truncated"),
])
def test_malformed_files_are_refused_naming_the_file(tmp_path, content, reason):
    path = tmp_path / "libbroken.so"
    path.write_bytes(content)
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(ElfError) as raised:
            SharedObject(fd, str(path))
    finally:
        os.close(fd)
    assert str(path) in str(raised.value) and reason in str(raised.value)


def test_a_dynamic_section_pointing_outside_the_file_is_refused(tmp_path, built):
    """A PT_DYNAMIC entry whose DT_STRTAB address lies outside every loaded segment."""
    data = bytearray(built["plain"].read_bytes())
    phoff, phentsize, phnum = struct.unpack_from("<Q", data, 32)[0], *struct.unpack_from("<HH", data, 54)
    for index in range(phnum):
        p_type, _flags, p_offset, _vaddr, _paddr, p_filesz = struct.unpack_from("<IIQQQQ", data, phoff + index * phentsize)
        if p_type == 2:
            for entry in range(p_filesz // 16):
                tag, _value = struct.unpack_from("<qQ", data, p_offset + entry * 16)
                if tag == 5:   # DT_STRTAB
                    struct.pack_into("<qQ", data, p_offset + entry * 16, 5, 1 << 50)
    path = tmp_path / "libbent.so"
    path.write_bytes(bytes(data))
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(ElfError, match="outside its loaded segments"):
            SharedObject(fd, str(path))
    finally:
        os.close(fd)
