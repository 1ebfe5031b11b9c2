//! Finding glibc's own `dlsym` and `dlvsym` without calling either: the shim exports both
//! names, so any call through them from inside the shim would land in its own
//! trampolines. The loaded C library's dynamic symbol table is read directly (walked with
//! `dl_iterate_phdr`, sized from its GNU or SysV hash table).

use std::ffi::{c_int, c_void, CStr};

const PT_DYNAMIC: u32 = 2;
const DT_NULL: i64 = 0;
const DT_HASH: i64 = 4;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;
const DT_GNU_HASH: i64 = 0x6fff_fef5;
const DT_VERSYM: i64 = 0x6fff_fff0;
/// `versym` bit marking a non-default (hidden) version.
const VERSYM_HIDDEN: u16 = 0x8000;

#[repr(C)]
struct Sym {
    name: u32,
    info: u8,
    other: u8,
    shndx: u16,
    value: u64,
    size: u64,
}

#[repr(C)]
struct Dyn {
    tag: i64,
    val: u64,
}

struct Search<'a> {
    name: &'a [u8],
    found: usize,
}

/// Address of `name` as defined (default version preferred) by the loaded C library.
pub fn libc_symbol(name: &CStr) -> Option<usize> {
    let mut s = Search {
        name: name.to_bytes(),
        found: 0,
    };
    // SAFETY: the callback only reads the loader's structures for the duration of the call.
    unsafe { libc::dl_iterate_phdr(Some(visit), (&mut s as *mut Search).cast()) };
    (s.found != 0).then_some(s.found)
}

unsafe extern "C" fn visit(
    info: *mut libc::dl_phdr_info,
    _size: usize,
    data: *mut c_void,
) -> c_int {
    let (Some(info), Some(s)) = (info.as_ref(), data.cast::<Search>().as_mut()) else {
        return 1;
    };
    if info.dlpi_name.is_null() {
        return 0;
    }
    let obj = CStr::from_ptr(info.dlpi_name).to_bytes();
    let base = obj.rsplit(|b| *b == b'/').next().unwrap_or(obj);
    if !base.starts_with(b"libc.so") {
        return 0;
    }
    if let Some(addr) = find_in(info, s.name) {
        s.found = addr;
        return 1;
    }
    0
}

unsafe fn find_in(info: &libc::dl_phdr_info, name: &[u8]) -> Option<usize> {
    let load = info.dlpi_addr as usize;
    let phdrs = std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum));
    let dynamic = phdrs.iter().find(|p| p.p_type == PT_DYNAMIC)?;
    // The loader relocates these pointers in place on most targets; not on all.
    let at = |v: u64| {
        let v = v as usize;
        if v < load {
            v + load
        } else {
            v
        }
    };
    let (mut strtab, mut symtab, mut hash, mut gnu_hash, mut versym) = (0, 0, 0, 0, 0);
    let mut d = (load + dynamic.p_vaddr as usize) as *const Dyn;
    while (*d).tag != DT_NULL {
        match (*d).tag {
            DT_STRTAB => strtab = at((*d).val),
            DT_SYMTAB => symtab = at((*d).val),
            DT_HASH => hash = at((*d).val),
            DT_GNU_HASH => gnu_hash = at((*d).val),
            DT_VERSYM => versym = at((*d).val),
            _ => {}
        }
        d = d.add(1);
    }
    if strtab == 0 || symtab == 0 {
        return None;
    }
    let count = if hash != 0 {
        *(hash as *const u32).add(1) as usize
    } else if gnu_hash != 0 {
        gnu_symbol_count(gnu_hash)
    } else {
        return None;
    };
    let syms = std::slice::from_raw_parts(symtab as *const Sym, count);
    let mut fallback = None;
    for (i, sym) in syms.iter().enumerate() {
        if sym.shndx == 0 || sym.value == 0 {
            continue;
        }
        if CStr::from_ptr((strtab + sym.name as usize) as *const libc::c_char).to_bytes() != name {
            continue;
        }
        let addr = load + sym.value as usize;
        let hidden = versym != 0 && *(versym as *const u16).add(i) & VERSYM_HIDDEN != 0;
        if !hidden {
            return Some(addr);
        }
        fallback.get_or_insert(addr);
    }
    fallback
}

/// Symbols covered by a GNU hash table: past the highest bucket's chain end.
unsafe fn gnu_symbol_count(table: usize) -> usize {
    let w = table as *const u32;
    let (nbuckets, symoffset, bloom_words) = (*w as usize, *w.add(1) as usize, *w.add(2) as usize);
    let buckets = (table + 16 + bloom_words * std::mem::size_of::<usize>()) as *const u32;
    let chains = buckets.add(nbuckets);
    let last = (0..nbuckets)
        .map(|b| *buckets.add(b) as usize)
        .max()
        .unwrap_or(0);
    if last < symoffset {
        return symoffset;
    }
    let mut i = last;
    while *chains.add(i - symoffset) & 1 == 0 {
        i += 1;
    }
    i + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_c_library_functions_the_linker_finds() {
        // (name, the address the dynamic linker binds for this test binary)
        let cases: [(&CStr, usize); 3] = [
            (c"dlopen", libc::dlopen as *const () as usize),
            (c"malloc", libc::malloc as *const () as usize),
            (
                c"dl_iterate_phdr",
                libc::dl_iterate_phdr as *const () as usize,
            ),
        ];
        for (name, want) in cases {
            assert_eq!(libc_symbol(name), Some(want), "{name:?}");
        }
        assert!(libc_symbol(c"dlvsym").is_some());
        assert_eq!(libc_symbol(c"no_such_symbol_in_libc"), None);
    }
}
