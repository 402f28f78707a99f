"""A minimal reader of ELF64 little-endian shared objects (x86_64, aarch64):
DT_NEEDED, DT_SONAME, DT_RUNPATH/DT_RPATH and the dynamic symbol table.

Used by test_torch_free_core.py so that the checks work without binutils;
where `readelf` exists the tests also record and compare its answer.
"""

import struct
from dataclasses import dataclass

SHT_DYNAMIC = 6
SHT_DYNSYM = 11
DT_NULL, DT_NEEDED, DT_SONAME, DT_RPATH, DT_RUNPATH = 0, 1, 14, 15, 29
STB_LOCAL = 0


@dataclass(frozen=True)
class Symbol:
    name: str
    defined: bool
    binding: int  # 1 global, 2 weak, 10 GNU unique


@dataclass
class Dynamic:
    needed: list
    soname: str
    runpath: list
    symbols: list  # global and weak dynamic symbols (no locals, no the null entry)

    @property
    def defined(self):
        return {s.name for s in self.symbols if s.defined}

    @property
    def undefined(self):
        return {s.name for s in self.symbols if not s.defined}


def _cstr(table, offset):
    end = table.index(b"\0", offset)
    return table[offset:end].decode()


def read_dynamic(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF":
        raise ValueError(f"{path} is not an ELF file")
    if data[4] != 2 or data[5] != 1:
        raise ValueError(f"{path}: only ELF64 little-endian is supported")
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = []
    for i in range(shnum):
        (_name, sh_type, _flags, _addr, offset, size, link, _info, _align, entsize) = struct.unpack_from(
            "<IIQQQQIIQQ", data, shoff + i * shentsize
        )
        sections.append((sh_type, offset, size, link, entsize))

    def strtab(index):
        _t, offset, size, _l, _e = sections[index]
        return data[offset:offset + size]

    needed, soname, runpath, symbols = [], "", [], []
    for sh_type, offset, size, link, entsize in sections:
        if sh_type == SHT_DYNAMIC:
            strings = strtab(link)
            for pos in range(offset, offset + size, entsize or 16):
                tag, val = struct.unpack_from("<qQ", data, pos)
                if tag == DT_NULL:
                    break
                if tag == DT_NEEDED:
                    needed.append(_cstr(strings, val))
                elif tag == DT_SONAME:
                    soname = _cstr(strings, val)
                elif tag in (DT_RPATH, DT_RUNPATH):
                    runpath.extend(_cstr(strings, val).split(":"))
        elif sh_type == SHT_DYNSYM:
            strings = strtab(link)
            step = entsize or 24
            for pos in range(offset + step, offset + size, step):  # entry 0 is the null symbol
                st_name, st_info, _other, st_shndx = struct.unpack_from("<IBBH", data, pos)
                binding = st_info >> 4
                if binding == STB_LOCAL:
                    continue
                symbols.append(Symbol(_cstr(strings, st_name), st_shndx != 0, binding))
    return Dynamic(needed, soname, runpath, symbols)
