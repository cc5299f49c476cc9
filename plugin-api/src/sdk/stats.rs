//! Per-tensor statistics of a chunked statistics pass (`CAP_CHUNKED_STATISTICS`): each chunk's
//! sums are recorded by its offset ([`ChunkSums`]) and added up per tensor in offset order, so the
//! totals are the same whichever threads produced the chunks; what a method derives from them
//! is looked up by the merge pass in a [`PerTensor`] map.

use super::{Error, Result, TensorMeta};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, PoisonError};

/// The sums of every chunk seen in a statistics pass, by tensor and chunk offset. Shared by the
/// host's worker threads (`add` takes `&self`).
#[derive(Debug, Default)]
pub struct ChunkSums {
    partial: Mutex<HashMap<String, BTreeMap<u64, Vec<f64>>>>,
}

impl ChunkSums {
    /// Records the sums of the chunk of `tensor` at `tensor.offset` (every chunk of a tensor
    /// gives as many sums).
    pub fn add(&self, tensor: &TensorMeta<'_>, sums: Vec<f64>) {
        let mut partial = self.partial.lock().unwrap_or_else(PoisonError::into_inner);
        partial
            .entry(tensor.name.to_owned())
            .or_default()
            .insert(tensor.offset, sums);
    }

    /// Every tensor's sums added up over its chunks in offset order, emptying the record.
    pub fn take_totals(&self) -> Vec<(String, Vec<f64>)> {
        let partial = std::mem::take(&mut *self.partial.lock().unwrap_or_else(PoisonError::into_inner));
        partial
            .into_iter()
            .map(|(name, chunks)| (name, total(&chunks)))
            .collect()
    }

    /// Tensor `name`'s sums added up over its chunks in offset order, removed from the record
    /// (`None` when no chunk of it was added).
    pub fn take_total(&self, name: &str) -> Option<Vec<f64>> {
        let chunks = self
            .partial
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(name)?;
        Some(total(&chunks))
    }
}

/// The sums of a tensor's chunks added up in offset order.
fn total(chunks: &BTreeMap<u64, Vec<f64>>) -> Vec<f64> {
    let mut total = vec![0f64; chunks.values().next().map_or(0, Vec::len)];
    for sums in chunks.values() {
        total.iter_mut().zip(sums).for_each(|(t, s)| *t += s);
    }
    total
}

/// What a method derived per tensor from its statistics pass, for the merge pass; filled at the
/// end of a pass or tensor by tensor (`finish_tensor`, from several threads at once).
#[derive(Debug)]
pub struct PerTensor<T>(Mutex<HashMap<String, T>>);

impl<T> Default for PerTensor<T> {
    fn default() -> Self {
        PerTensor(Mutex::new(HashMap::new()))
    }
}

impl<T> FromIterator<(String, T)> for PerTensor<T> {
    fn from_iter<I: IntoIterator<Item = (String, T)>>(iter: I) -> Self {
        PerTensor(Mutex::new(iter.into_iter().collect()))
    }
}

impl<T: Clone> PerTensor<T> {
    /// The value of `tensor`, or an error naming it and `method` when the statistics pass did
    /// not see it.
    pub fn get(&self, tensor: &TensorMeta<'_>, method: &str) -> Result<T> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(tensor.name)
            .cloned()
            .ok_or_else(|| {
                Error::Message(format!(
                    "tensor '{}': {method} needs the host's statistics pass, which did not see this tensor",
                    tensor.name
                ))
            })
    }

    /// Records the value of tensor `name`.
    pub fn insert(&self, name: String, value: T) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(name, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(name: &str, offset: u64) -> TensorMeta<'_> {
        TensorMeta {
            name,
            role: 0,
            index: 0,
            count: 1,
            offset,
            full_numel: 0,
            full_shape: &[],
        }
    }

    #[test]
    fn totals_add_chunks_in_offset_order_whatever_order_they_came_in() {
        // 1e16 + 1 − 1e16 is 0 in f64 one way round and 1 the other: offset order decides.
        let a = ChunkSums::default();
        a.add(&meta("w", 20), vec![-1e16]);
        a.add(&meta("w", 0), vec![1e16]);
        a.add(&meta("w", 10), vec![1.0]);
        a.add(&meta("b", 0), vec![2.5]);
        let mut totals = a.take_totals();
        totals.sort_by(|x, y| x.0.cmp(&y.0));
        assert_eq!(
            totals,
            vec![("b".to_owned(), vec![2.5]), ("w".to_owned(), vec![1e16 + 1.0 - 1e16])]
        );
        assert!(a.take_totals().is_empty(), "the record is emptied");
    }

    #[test]
    fn one_tensor_is_totalled_and_taken_alone() {
        let a = ChunkSums::default();
        a.add(&meta("w", 20), vec![-1e16, 1.0]);
        a.add(&meta("w", 0), vec![1e16, 2.0]);
        a.add(&meta("w", 10), vec![1.0, 3.0]);
        a.add(&meta("b", 0), vec![2.5, 0.0]);
        // In offset order: (1e16 + 1) − 1e16 = 0 in f64 (the 1 is lost), and 2 + 3 + 1 = 6.
        assert_eq!(a.take_total("w"), Some(vec![0.0, 6.0]));
        assert_eq!(a.take_total("w"), None, "taken");
        assert_eq!(a.take_totals(), vec![("b".to_owned(), vec![2.5, 0.0])]);
    }

    #[test]
    fn a_tensor_the_pass_did_not_see_is_named() {
        let m: PerTensor<f64> = [("w".to_owned(), 0.5)].into_iter().collect();
        assert_eq!(m.get(&meta("w", 0), "slerp").unwrap(), 0.5);
        let e = m.get(&meta("x", 0), "slerp").unwrap_err().to_string();
        assert!(e.contains("tensor 'x'") && e.contains("slerp"), "{e}");
    }
}
