"""What a shared object asks of the dynamic loader, read from the file before anything is loaded.

The loader decides which files are loaded from these facts: the names a library needs
(DT_NEEDED), its own name (DT_SONAME), where it asks to be searched for them (DT_RPATH,
DT_RUNPATH) and whether it defines a symbol (its dynamic symbol table, through DT_GNU_HASH or
DT_HASH). Only ELF64 little-endian objects are read (x86-64 and aarch64, the machines CANN
ships for). Every read goes through the caller's descriptor (os.pread), so what is read is the
file the caller checked, and every offset and size is checked against the file's size.
"""

from __future__ import annotations

import os
import struct
from typing import Dict, List, Optional, Tuple

__all__ = ["ElfError", "SharedObject"]

_HEADER = struct.Struct("<16sHHIQQQIHHHHHH")
_PROGRAM_HEADER = struct.Struct("<IIQQQQQQ")
_DYNAMIC_ENTRY = struct.Struct("<qQ")
_SYMBOL = struct.Struct("<IBBHQQ")
_WORD = struct.Struct("<I")

_ET_DYN = 3
_PT_LOAD, _PT_DYNAMIC = 1, 2
_DT_NULL, _DT_NEEDED, _DT_HASH, _DT_STRTAB, _DT_SYMTAB, _DT_STRSZ = 0, 1, 4, 5, 6, 10
_DT_SONAME, _DT_RPATH, _DT_RUNPATH, _DT_GNU_HASH = 14, 15, 29, 0x6FFFFEF5
_STB_GLOBAL, _STB_WEAK, _STB_GNU_UNIQUE = 1, 2, 10
_STV_DEFAULT, _STV_PROTECTED = 0, 3

# Sanity limits far above what real objects use, so that a malformed file cannot make a read huge.
_MAX_PROGRAM_HEADERS = 4096
_MAX_DYNAMIC_ENTRIES = 65536
_MAX_NAME = 4096
_MAX_CHAIN = 1 << 24


class ElfError(ValueError):
    """The file is not an ELF64 little-endian shared object this reader can follow."""


def _gnu_hash(name: bytes) -> int:
    value = 5381
    for byte in name:
        value = (value * 33 + byte) & 0xFFFFFFFF
    return value


def _sysv_hash(name: bytes) -> int:
    value = 0
    for byte in name:
        value = ((value << 4) + byte) & 0xFFFFFFFF
        high = value & 0xF0000000
        if high:
            value ^= high >> 24
        value &= ~high & 0xFFFFFFFF
    return value


class SharedObject:
    """The dynamic section of one shared object, read through an open descriptor (not owned)."""

    def __init__(self, fd: int, what: str = "the file") -> None:
        self._fd = fd
        self._what = what
        self._size = os.fstat(fd).st_size
        header = self._read(0, _HEADER.size)
        (ident, e_type, _machine, _version, _entry, phoff, _shoff, _flags, _ehsize, phentsize, phnum,
         _shentsize, _shnum, _shstrndx) = _HEADER.unpack(header)
        if ident[:4] != b"\x7fELF":
            raise ElfError(f"{what} is not an ELF file")
        if ident[4] != 2 or ident[5] != 1:
            raise ElfError(f"{what} is not a 64-bit little-endian ELF object")
        if e_type != _ET_DYN:
            raise ElfError(f"{what} is not a shared object (ELF type {e_type})")
        if phnum > _MAX_PROGRAM_HEADERS or (phnum and phentsize < _PROGRAM_HEADER.size):
            raise ElfError(f"{what} has a malformed program header table")
        self._loads: List[Tuple[int, int, int]] = []   # (vaddr, file offset, file size)
        dynamic: Optional[Tuple[int, int]] = None
        for index in range(phnum):
            fields = _PROGRAM_HEADER.unpack(self._read(phoff + index * phentsize, _PROGRAM_HEADER.size))
            p_type, _pflags, p_offset, p_vaddr, _paddr, p_filesz = fields[:6]
            if p_type == _PT_LOAD:
                self._loads.append((p_vaddr, p_offset, p_filesz))
            elif p_type == _PT_DYNAMIC:
                dynamic = (p_offset, p_filesz)
        self._entries: Dict[int, List[int]] = {}
        if dynamic is not None:
            offset, size = dynamic
            count = min(size // _DYNAMIC_ENTRY.size, _MAX_DYNAMIC_ENTRIES)
            data = self._read(offset, count * _DYNAMIC_ENTRY.size)
            for index in range(count):
                tag, value = _DYNAMIC_ENTRY.unpack_from(data, index * _DYNAMIC_ENTRY.size)
                if tag == _DT_NULL:
                    break
                self._entries.setdefault(tag, []).append(value)
        strtab = self._one(_DT_STRTAB)
        self._strtab = self._offset_of(strtab) if strtab is not None else None
        self._strsz = self._one(_DT_STRSZ) or 0
        if self._strtab is not None and (self._strtab + self._strsz > self._size):
            raise ElfError(f"{what} has a string table past its end")
        self.needed: Tuple[str, ...] = tuple(self._string(v) for v in self._entries.get(_DT_NEEDED, []))
        soname = self._one(_DT_SONAME)
        self.soname: Optional[str] = self._string(soname) if soname is not None else None
        self.rpath: Tuple[str, ...] = self._paths(_DT_RPATH)
        self.runpath: Tuple[str, ...] = self._paths(_DT_RUNPATH)

    # ---- reading ----

    def _read(self, offset: int, size: int) -> bytes:
        if offset < 0 or size < 0 or offset + size > self._size:
            raise ElfError(f"{self._what} is truncated (a read of {size} bytes at {offset} is past its end)")
        data = os.pread(self._fd, size, offset)
        if len(data) != size:
            raise ElfError(f"{self._what} changed size while it was read")
        return data

    def _one(self, tag: int) -> Optional[int]:
        values = self._entries.get(tag)
        return values[0] if values else None

    def _offset_of(self, address: int) -> int:
        """The file offset of a virtual address inside one of the loaded segments."""
        for vaddr, offset, size in self._loads:
            if vaddr <= address < vaddr + size:
                return offset + (address - vaddr)
        raise ElfError(f"{self._what} refers to address {address:#x} outside its loaded segments")

    def _string(self, index: int) -> str:
        return os.fsdecode(self._name_bytes(index))

    def _name_bytes(self, index: int) -> bytes:
        if self._strtab is None or index >= self._strsz:
            raise ElfError(f"{self._what} names a string outside its string table")
        start = self._strtab + index
        length = min(_MAX_NAME, self._strtab + self._strsz - start)
        data = self._read(start, length)
        end = data.find(b"\0")
        if end < 0:
            raise ElfError(f"{self._what} has an unterminated or overlong name in its string table")
        return data[:end]

    def _paths(self, tag: int) -> Tuple[str, ...]:
        entries: List[str] = []
        for value in self._entries.get(tag, []):
            entries.extend(self._string(value).split(":"))
        return tuple(entries)

    # ---- symbols ----

    def defines(self, symbol: str) -> Optional[bool]:
        """Whether the object itself defines and exports `symbol` (a global or weak symbol of
        default or protected visibility); None when it has no hash table to look it up by."""
        symtab = self._one(_DT_SYMTAB)
        if symtab is None or self._strtab is None:
            return None
        name = symbol.encode()
        symtab_offset = self._offset_of(symtab)
        gnu = self._one(_DT_GNU_HASH)
        if gnu is not None:
            return self._gnu_lookup(self._offset_of(gnu), symtab_offset, name)
        sysv = self._one(_DT_HASH)
        if sysv is not None:
            return self._sysv_lookup(self._offset_of(sysv), symtab_offset, name)
        return None

    def _symbol_matches(self, symtab_offset: int, index: int, name: bytes) -> bool:
        st_name, st_info, st_other, st_shndx, _value, _size = _SYMBOL.unpack(
            self._read(symtab_offset + index * _SYMBOL.size, _SYMBOL.size))
        if st_shndx == 0 or (st_info >> 4) not in (_STB_GLOBAL, _STB_WEAK, _STB_GNU_UNIQUE):
            return False
        if (st_other & 3) not in (_STV_DEFAULT, _STV_PROTECTED):
            return False
        return self._name_bytes(st_name) == name

    def _gnu_lookup(self, table: int, symtab_offset: int, name: bytes) -> bool:
        nbuckets, symoffset, bloom_size, _shift = struct.unpack("<IIII", self._read(table, 16))
        if nbuckets == 0:
            return False
        buckets = table + 16 + bloom_size * 8
        chains = buckets + nbuckets * 4
        wanted = _gnu_hash(name)
        (index,) = _WORD.unpack(self._read(buckets + (wanted % nbuckets) * 4, 4))
        if index < symoffset:
            return False
        for _ in range(_MAX_CHAIN):
            (value,) = _WORD.unpack(self._read(chains + (index - symoffset) * 4, 4))
            if (value | 1) == (wanted | 1) and self._symbol_matches(symtab_offset, index, name):
                return True
            if value & 1:
                return False
            index += 1
        raise ElfError(f"{self._what} has a GNU hash chain that does not end")

    def _sysv_lookup(self, table: int, symtab_offset: int, name: bytes) -> bool:
        nbucket, nchain = struct.unpack("<II", self._read(table, 8))
        if nbucket == 0:
            return False
        (index,) = _WORD.unpack(self._read(table + 8 + (_sysv_hash(name) % nbucket) * 4, 4))
        chains = table + 8 + nbucket * 4
        for _ in range(min(nchain, _MAX_CHAIN) + 1):
            if index == 0 or index >= nchain:
                return False
            if self._symbol_matches(symtab_offset, index, name):
                return True
            (index,) = _WORD.unpack(self._read(chains + index * 4, 4))
        raise ElfError(f"{self._what} has a hash chain that does not end")
