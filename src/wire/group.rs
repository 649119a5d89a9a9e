//! KV cache groups: vLLM's hybrid allocator gives each attention kind of a model (full
//! attention, a sliding window, ...) its own group of blocks, and every event names its group
//! (`group_idx`); stores also name the group's kind (`kv_cache_spec_kind`) and window
//! (`kv_cache_spec_sliding_window`). An event without them is group 0, full attention: what
//! every engine without groups means.
//!
//! Only the kinds whose reuse rule kvdir models get credit of their own ([`AttentionKind`]);
//! the rest are [`AttentionKind::Unmodelled`], and a stream with one credits nothing
//! (protocol.md, *Hybrid attention*).

use std::fmt;

/// Groups a stream may have: group indexes are below this (vLLM has a handful).
pub const MAX_GROUPS: u32 = 32;

/// A KV cache group's attention kind, as its stores name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AttentionKind {
    /// `full_attention`, `mla_attention`, `sink_full_attention`, or no kind: every block of the
    /// prefix is needed.
    Full,
    /// `sliding_window` or `sliding_window_mla`: only the blocks the window reaches, in tokens.
    SlidingWindow {
        /// The window, in tokens.
        window: u32,
    },
    /// A kind kvdir does not model: `mamba`, `chunked_local_attention` (its chunk size is
    /// not published), `cross_attention`, `encoder_only_attention`, `unknown`, a sliding
    /// window without its size, or any name a later engine adds.
    Unmodelled(Unmodelled),
}

/// The unmodelled kinds, kept by name for reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unmodelled {
    /// `mamba` (and linear attention): a state per position, not a run of blocks.
    Mamba,
    /// `chunked_local_attention`: the chunk size is not in the events.
    ChunkedLocal,
    /// `cross_attention` or `encoder_only_attention`: not a prefix cache.
    Encoder,
    /// `sliding_window` without `kv_cache_spec_sliding_window`.
    WindowMissing,
    /// `unknown`, or a name this version does not know.
    Other,
}

impl AttentionKind {
    /// The kind a store names: `kind` is `kv_cache_spec_kind` (absent means full attention),
    /// `window` is `kv_cache_spec_sliding_window`.
    pub fn from_wire(kind: Option<&[u8]>, window: Option<u32>) -> Self {
        let Some(kind) = kind else { return AttentionKind::Full };
        match kind {
            b"full_attention" | b"mla_attention" | b"sink_full_attention" => AttentionKind::Full,
            b"sliding_window" | b"sliding_window_mla" => match window {
                Some(window) if window > 0 => AttentionKind::SlidingWindow { window },
                _ => AttentionKind::Unmodelled(Unmodelled::WindowMissing),
            },
            b"mamba" => AttentionKind::Unmodelled(Unmodelled::Mamba),
            b"chunked_local_attention" => AttentionKind::Unmodelled(Unmodelled::ChunkedLocal),
            b"cross_attention" | b"encoder_only_attention" => {
                AttentionKind::Unmodelled(Unmodelled::Encoder)
            }
            _ => AttentionKind::Unmodelled(Unmodelled::Other),
        }
    }

    /// Consecutive cached blocks of `block_size` tokens a sliding window needs for a hit
    /// (vLLM's `cdiv(sliding_window - 1, block_size)`); `None` for other kinds.
    pub fn window_blocks(self, block_size: u32) -> Option<u32> {
        match self {
            AttentionKind::SlidingWindow { window } => {
                Some((window - 1).div_ceil(block_size.max(1)))
            }
            _ => None,
        }
    }
}

impl fmt::Display for AttentionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttentionKind::Full => f.write_str("full_attention"),
            AttentionKind::SlidingWindow { window } => write!(f, "sliding_window({window})"),
            AttentionKind::Unmodelled(u) => f.write_str(match u {
                Unmodelled::Mamba => "mamba",
                Unmodelled::ChunkedLocal => "chunked_local_attention",
                Unmodelled::Encoder => "encoder attention",
                Unmodelled::WindowMissing => "sliding_window without its size",
                Unmodelled::Other => "unknown",
            }),
        }
    }
}

/// The group an event names: its index and, on stores, its kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Group {
    /// `group_idx` (0 when absent).
    pub idx: u32,
    /// The kind a store names (`None` on removals, and where `kv_cache_spec_kind` is absent
    /// and no `group_idx` was sent either).
    pub kind: Option<AttentionKind>,
}

impl Group {
    /// Whether the event is of the default group: group 0 with no kind other than full
    /// attention, what a dense model's events say (with or without the group fields).
    pub fn is_default(&self) -> bool {
        self.idx == 0 && matches!(self.kind, None | Some(AttentionKind::Full))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_map_to_vllms_managers() {
        let k = |s: &str, w| AttentionKind::from_wire(Some(s.as_bytes()), w);
        assert_eq!(AttentionKind::from_wire(None, None), AttentionKind::Full);
        assert_eq!(k("full_attention", None), AttentionKind::Full);
        assert_eq!(k("mla_attention", None), AttentionKind::Full);
        assert_eq!(k("sliding_window", Some(64)), AttentionKind::SlidingWindow { window: 64 });
        assert_eq!(k("sliding_window_mla", Some(8)), AttentionKind::SlidingWindow { window: 8 });
        assert_eq!(k("sliding_window", None), AttentionKind::Unmodelled(Unmodelled::WindowMissing));
        assert_eq!(k("mamba", None), AttentionKind::Unmodelled(Unmodelled::Mamba));
        assert_eq!(k("something_new", None), AttentionKind::Unmodelled(Unmodelled::Other));
    }

    #[test]
    fn a_window_needs_cdiv_window_minus_one_blocks() {
        let sw = |window| AttentionKind::SlidingWindow { window };
        assert_eq!(sw(64).window_blocks(32), Some(2), "cdiv(63, 32)");
        assert_eq!(sw(65).window_blocks(32), Some(2), "cdiv(64, 32)");
        assert_eq!(sw(66).window_blocks(32), Some(3));
        assert_eq!(sw(128).window_blocks(16), Some(8));
        assert_eq!(sw(1).window_blocks(16), Some(0), "a window of one token needs no block");
        assert_eq!(AttentionKind::Full.window_blocks(16), None);
    }
}
