//! Byte sizes of CUDA arrays and mipmapped arrays from their descriptors, so array
//! allocations are charged like any other (HAMi-core lets them pass its limit).

/// Largest element of any CUDA array format (4 channels of 32 bits, BC blocks per texel).
const MAX_ELEMENT: u64 = 16;

/// Bytes per channel for a `CUarray_format` the shim knows, `None` otherwise.
pub fn format_bytes(format: u32) -> Option<u64> {
    Some(match format {
        0x01 | 0x08 => 1,        // UNSIGNED_INT8, SIGNED_INT8
        0x02 | 0x09 | 0x10 => 2, // UNSIGNED_INT16, SIGNED_INT16, HALF
        0x03 | 0x0a | 0x20 => 4, // UNSIGNED_INT32, SIGNED_INT32, FLOAT
        _ => return None,
    })
}

/// Bytes of one element: known formats exactly, unknown ones at the largest element size
/// (over-counting a format we do not know is safe; under-counting would lift the limit).
fn element_bytes(format: u32, channels: u32) -> Option<u64> {
    match format_bytes(format) {
        Some(b) => b.checked_mul(u64::from(channels.clamp(1, 4))),
        None => Some(MAX_ELEMENT),
    }
}

/// Bytes of one array level (`depth` 0 means 2D, `height` 0 means 1D). `None` on overflow.
pub fn array_bytes(width: u64, height: u64, depth: u64, format: u32, channels: u32) -> Option<u64> {
    let elem = element_bytes(format, channels)?;
    width
        .checked_mul(height.max(1))?
        .checked_mul(depth.max(1))?
        .checked_mul(elem)
}

/// Bytes of a mipmapped array with `levels` levels, each half the previous (at least 1).
pub fn mipmapped_bytes(
    width: u64,
    height: u64,
    depth: u64,
    format: u32,
    channels: u32,
    levels: u32,
) -> Option<u64> {
    let (mut w, mut h, mut d) = (width, height, depth);
    let mut sum: u64 = 0;
    for _ in 0..levels.max(1) {
        sum = sum.checked_add(array_bytes(w, h, d, format, channels)?)?;
        w = (w / 2).max(1);
        h = if h == 0 { 0 } else { (h / 2).max(1) };
        d = if d == 0 { 0 } else { (d / 2).max(1) };
    }
    Some(sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn array_sizes() {
        // (w, h, d, format, channels, bytes)
        let cases = [
            (1024, 0, 0, 0x20, 1, Some(4096)),
            (1024, 1024, 0, 0x01, 4, Some(4 << 20)),
            (64, 64, 64, 0x10, 2, Some(64 * 64 * 64 * 4)),
            (1, 1, 1, 0x99, 1, Some(16)),
            (u64::MAX, 2, 0, 0x20, 1, None),
        ];
        for (w, h, d, f, c, want) in cases {
            assert_eq!(array_bytes(w, h, d, f, c), want, "{w}x{h}x{d} f={f:#x}");
        }
    }

    #[test]
    fn mipmap_levels_sum() {
        assert_eq!(mipmapped_bytes(8, 8, 0, 0x01, 1, 4), Some(64 + 16 + 4 + 1));
        assert_eq!(
            mipmapped_bytes(8, 0, 0, 0x01, 1, 10),
            Some(8 + 4 + 2 + 1 + 6)
        );
        assert_eq!(mipmapped_bytes(4, 4, 4, 0x01, 1, 1), Some(64));
    }
}
