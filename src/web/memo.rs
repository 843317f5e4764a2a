//! One value derived from a shared input, kept until the input is replaced: what every
//! status answer and page would otherwise derive again from the same health snapshot or the
//! same routes (at 10,000 routes, each of those derivations costs milliseconds per request).
//!
//! The input is recognised by identity (the same `Arc`), held weakly: a replaced input is
//! never mistaken for its successor, and the memo does not keep it alive.

use std::sync::{Arc, Mutex, Weak};

/// See the module doc.
pub struct Memo<K, V> {
    last: Mutex<Option<(Weak<K>, Arc<V>)>>,
}

impl<K, V> Default for Memo<K, V> {
    fn default() -> Self {
        Self {
            last: Mutex::new(None),
        }
    }
}

impl<K, V> std::fmt::Debug for Memo<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Memo")
    }
}

impl<K, V> Memo<K, V> {
    /// The value derived from `input`: the kept one when `input` is the same `Arc` as last
    /// time, else `derive(input)`, kept in its place.
    pub fn get(&self, input: &Arc<K>, derive: impl FnOnce(&K) -> V) -> Arc<V> {
        let kept = |last: &Option<(Weak<K>, Arc<V>)>| {
            last.as_ref()
                .filter(|(k, _)| {
                    std::ptr::eq(k.as_ptr(), Arc::as_ptr(input)) && k.strong_count() > 0
                })
                .map(|(_, v)| v.clone())
        };
        if let Some(v) = kept(&self.lock()) {
            return v;
        }
        // Derived outside the lock: two requests may both derive once after a change, but
        // none waits for another's derivation.
        let v = Arc::new(derive(input));
        *self.lock() = Some((Arc::downgrade(input), v.clone()));
        v
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<(Weak<K>, Arc<V>)>> {
        self.last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[test]
    fn derives_once_per_input_and_again_for_a_new_one() {
        let memo = Memo::<Vec<u32>, u32>::default();
        let calls = AtomicU32::new(0);
        let sum = |v: &Vec<u32>| {
            calls.fetch_add(1, Ordering::SeqCst);
            v.iter().sum()
        };
        let a = Arc::new(vec![1, 2, 3]);
        assert_eq!(*memo.get(&a, sum), 6);
        assert_eq!(*memo.get(&a, sum), 6);
        assert_eq!(
            calls.load(Ordering::SeqCst),
            1,
            "the same input is derived once"
        );
        // An equal but distinct input is another input.
        let b = Arc::new(vec![1, 2, 3, 4]);
        assert_eq!(*memo.get(&b, sum), 10);
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        // A dropped input whose address is reused is not mistaken for the kept one.
        drop(b);
        let c = Arc::new(vec![5, 5, 5, 5]);
        assert_eq!(*memo.get(&c, sum), 20);
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }
}
