//! Element types that collectives move and reduce.

use std::fmt;

use half::{bf16, f16};

/// The element type of a buffer, carried on the wire so that ranks passing different types are caught.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DType {
    /// 32-bit IEEE float.
    F32 = 1,
    /// 64-bit IEEE float.
    F64 = 2,
    /// 16-bit IEEE float.
    F16 = 3,
    /// bfloat16.
    BF16 = 4,
    /// Signed 32-bit integer.
    I32 = 5,
    /// Signed 64-bit integer.
    I64 = 6,
    /// Unsigned byte.
    U8 = 7,
}

impl DType {
    /// Every element type, in wire-code order.
    pub const ALL: [DType; 7] = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I32,
        DType::I64,
        DType::U8,
    ];

    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F64 | DType::I64 => 8,
            DType::F16 | DType::BF16 => 2,
            DType::U8 => 1,
        }
    }

    /// Short lower-case name (`f32`, `bf16`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U8 => "u8",
        }
    }

    /// Decodes a wire code.
    #[inline]
    pub fn from_code(code: u8) -> Option<DType> {
        // `ALL` lists the variants in the order of their codes, from 1: an index, not a search
        // (this decodes every message's header); checked, so a list out of order only refuses.
        let v = *DType::ALL.get(usize::from(code.wrapping_sub(1)))?;
        (v as u8 == code).then_some(v)
    }

    /// Parses a name as printed by [`DType::name`].
    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == name)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A plain element type kolo can send and reduce: `f32`, `f64`, `f16`, `bf16`, `i32`, `i64`, `u8`.
///
/// Sealed: the reduction kernels are written for exactly these types.
pub trait Element:
    bytemuck::Pod + PartialOrd + Send + Sync + fmt::Debug + sealed::Sealed + 'static
{
    /// The runtime tag of this type.
    const DTYPE: DType;
}

macro_rules! element {
    ($($t:ty => $d:ident),*) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$d;
        }
    )*};
}
element!(f32 => F32, f64 => F64, f16 => F16, bf16 => BF16, i32 => I32, i64 => I64, u8 => U8);

/// Views a typed slice as bytes.
pub fn as_bytes<T: Element>(s: &[T]) -> &[u8] {
    bytemuck::cast_slice(s)
}

/// Views a typed mutable slice as bytes.
pub fn as_bytes_mut<T: Element>(s: &mut [T]) -> &mut [u8] {
    bytemuck::cast_slice_mut(s)
}

/// Copies bytes (of any alignment) into a new typed vector; `bytes.len()` must be a multiple of the
/// element size (callers check lengths first).
pub fn vec_from_bytes<T: Element>(bytes: &[u8]) -> Vec<T> {
    let n = bytes.len() / std::mem::size_of::<T>();
    let mut out = vec![T::zeroed(); n];
    as_bytes_mut(&mut out).copy_from_slice(&bytes[..n * std::mem::size_of::<T>()]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_code(d as u8), Some(d));
            assert_eq!(DType::from_name(d.name()), Some(d));
        }
        assert_eq!(DType::from_code(0), None);
        assert_eq!(DType::from_code(200), None);
    }

    #[test]
    fn sizes_match_rust_types() {
        assert_eq!(DType::F32.size(), std::mem::size_of::<f32>());
        assert_eq!(DType::BF16.size(), std::mem::size_of::<bf16>());
        assert_eq!(DType::I64.size(), std::mem::size_of::<i64>());
    }

    #[test]
    fn vec_from_unaligned_bytes() {
        let v: Vec<f64> = vec![1.5, -2.0, 3.25];
        let mut bytes = vec![0u8];
        bytes.extend_from_slice(as_bytes(&v));
        assert_eq!(vec_from_bytes::<f64>(&bytes[1..]), v);
    }
}
