//! The bytes of a pickled Python object as a value of kolo's object collectives
//! (`broadcast_object`, `all_gather_object`, `gather_object`, which serialize with serde): Python
//! pickles (only it can pickle arbitrary Python objects), kolo moves the bytes — one
//! implementation of the length exchange and the variable-count collectives under both.

use std::fmt;

use serde::de::{Deserializer, Visitor};
use serde::ser::Serializer;
use serde::{Deserialize, Serialize};

/// Pickled bytes, serialized as one run of bytes (serde's `Vec<u8>` would go byte by byte).
#[derive(Debug)]
pub(crate) struct Pickled(pub(crate) Vec<u8>);

impl Serialize for Pickled {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.0)
    }
}

impl<'de> Deserialize<'de> for Pickled {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_byte_buf(BytesVisitor)
    }
}

struct BytesVisitor;

impl<'de> Visitor<'de> for BytesVisitor {
    type Value = Pickled;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the bytes of a pickled object")
    }

    fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Pickled, E> {
        Ok(Pickled(v.to_vec()))
    }

    fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<Pickled, E> {
        Ok(Pickled(v))
    }
}
