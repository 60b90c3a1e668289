//! Locks that outlive a panicking holder. A handler panic is caught and recorded (SPEC §8), so
//! a poisoned lock only means a panic happened while it was held; the data is still the last
//! consistent state the holder wrote, and the organism keeps running with it.
//!
//! And [`take_off`]: a count of what is held, given back without wrapping below 0.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

pub(crate) fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

pub(crate) fn read<T: ?Sized>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(PoisonError::into_inner)
}

pub(crate) fn write<T: ?Sized>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(PoisonError::into_inner)
}

/// Takes `n` off a count of what is held, never below 0: each is given back once, and this
/// only keeps a mistake from wrapping round to refusing everything.
pub(crate) fn take_off(count: &AtomicUsize, n: usize) {
    let _ = count.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
        Some(v.saturating_sub(n))
    });
}
