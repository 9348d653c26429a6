//! Cutting an index list into mini-batches.

use crate::error::DataError;

/// An iterator over consecutive mini-batches of an index slice; see
/// [`batches`].
#[derive(Debug, Clone)]
pub struct Batches<'a> {
    chunks: std::slice::Chunks<'a, usize>,
    remaining: usize,
}

impl<'a> Iterator for Batches<'a> {
    type Item = &'a [usize];

    fn next(&mut self) -> Option<&'a [usize]> {
        if self.remaining == 0 {
            return None;
        }
        self.remaining -= 1;
        self.chunks.next()
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining, Some(self.remaining))
    }
}

impl ExactSizeIterator for Batches<'_> {}

/// The number of batches [`batches`] yields for `len` indices.
/// (`batch_size` 0 yields 0.)
pub fn num_batches(len: usize, batch_size: usize, drop_last: bool) -> usize {
    match batch_size {
        0 => 0,
        b if drop_last => len / b,
        b => len.div_ceil(b),
    }
}

/// Consecutive batches of `batch_size` indices; the last, shorter batch is
/// kept unless `drop_last`. Errors if `batch_size` is 0.
pub fn batches(
    indices: &[usize],
    batch_size: usize,
    drop_last: bool,
) -> Result<Batches<'_>, DataError> {
    if batch_size == 0 {
        return Err(DataError::invalid("batch_size", "must be at least 1"));
    }
    Ok(Batches {
        chunks: indices.chunks(batch_size),
        remaining: num_batches(indices.len(), batch_size, drop_last),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_keep_or_drop_the_tail() -> Result<(), DataError> {
        let idx: Vec<usize> = (0..7).collect();
        let kept: Vec<&[usize]> = batches(&idx, 3, false)?.collect();
        assert_eq!(kept, vec![&[0, 1, 2][..], &[3, 4, 5], &[6]]);
        let dropped: Vec<&[usize]> = batches(&idx, 3, true)?.collect();
        assert_eq!(dropped, vec![&[0, 1, 2][..], &[3, 4, 5]]);
        assert_eq!(batches(&idx, 3, true)?.len(), 2);
        assert_eq!(batches(&idx, 7, true)?.len(), 1);
        assert_eq!(batches(&idx, 8, true)?.len(), 0);
        assert_eq!(batches(&idx, 8, false)?.len(), 1);
        assert_eq!(batches(&[], 2, false)?.len(), 0);
        assert!(matches!(
            batches(&idx, 0, false),
            Err(DataError::InvalidArgument { .. })
        ));
        Ok(())
    }
}
