//! [`Handles`]: a number for each instance name the directory has seen, which its entries'
//! labels carry ([`kvdir::index::StreamLabel::instance_handle`]), so that a read groups and
//! orders a prompt's streams, and the router finds each instance's position, by a number
//! instead of by comparing and hashing names (at 4,096 streams, about a seventh of a route).
//!
//! Invariant: a handle names one instance for the life of the process; it is never given to
//! another name, so a reader and the router may hold one across snapshots without checking
//! the name. The table keeps every name it was given (a few dozen bytes each; a fleet whose
//! instance names churn adds one per new name).

use std::sync::Mutex;

use kvdir::car::NameMap;

/// The handles given so far, by instance name.
#[derive(Debug, Default)]
pub struct Handles {
    by_name: Mutex<NameMap<String, u32>>,
}

impl Handles {
    /// The handle of `name`, given now if it has none.
    pub fn of(&self, name: &str) -> u32 {
        let mut by_name = crate::sync::lock(&self.by_name);
        if let Some(&h) = by_name.get(name) {
            return h;
        }
        let h = u32::try_from(by_name.len()).unwrap_or(u32::MAX);
        by_name.insert(name.to_string(), h);
        h
    }

    /// The handle of `name`, if it has one.
    pub fn get(&self, name: &str) -> Option<u32> {
        crate::sync::lock(&self.by_name).get(name).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_keeps_its_handle_and_no_two_names_share_one() {
        let h = Handles::default();
        let (a, b) = (h.of("a"), h.of("b"));
        assert_ne!(a, b);
        assert_eq!((h.of("a"), h.get("b"), h.get("c")), (a, Some(b), None));
        assert_ne!(h.of("c"), a);
    }
}
