//! Locks that survive a panicked holder. Every structure kvdir guards with a lock stays valid at
//! any point a panic can interrupt it (maps of actor handles, status snapshots, counters), so a
//! poisoned lock is taken anyway: skipping the update instead (`if let Ok(..) = lock()`) would
//! silently lose it, and failing would take the service down for one panicked thread.

use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Locks `m`, poisoned or not.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Read-locks `l`, poisoned or not.
pub fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}

/// Write-locks `l`, poisoned or not.
pub fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}
