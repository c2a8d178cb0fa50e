//! What the quantized formats and their packings share: the block of 32
//! values, and sizing of the buffers they reuse from input to input.

/// Elements per quantization block, for every format here.
pub const BLOCK: usize = 32;

/// `buf` holding exactly `len` elements, its capacity kept.
pub(crate) fn sized<T: Copy + Default>(buf: &mut Vec<T>, len: usize) -> &mut [T] {
    buf.resize(len, T::default());
    buf
}
