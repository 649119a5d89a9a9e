//! A minimal MessagePack reader and writer over byte slices.
//!
//! The decoder in [`super::decode`] needs three things that generic serde decoders do not give
//! cheaply: no allocation per value, tolerance for producers that add or reorder fields, and
//! errors that name the field and the offset. The reader is a cursor over a borrowed slice; every
//! read checks bounds first, and [`Reader::skip`] bounds nesting so hostile input cannot exhaust
//! the stack.

use super::WireError;

mod write;
pub use write::Writer;

/// Deepest nesting [`Reader::skip`] follows before it reports [`WireError::TooDeep`].
pub const MAX_DEPTH: usize = 32;

/// An integer as MessagePack encodes it: unsigned or negative.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Int {
    /// A non-negative value (uint formats and non-negative int formats).
    U(u64),
    /// A negative value.
    I(i64),
}

/// A cursor over one MessagePack document.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

/// A readable name for the format family behind a marker byte, for error messages.
pub fn marker_name(marker: u8) -> &'static str {
    match marker {
        0x00..=0x7f | 0xe0..=0xff | 0xcc..=0xd3 => "integer",
        0x80..=0x8f | 0xde | 0xdf => "map",
        0x90..=0x9f | 0xdc | 0xdd => "array",
        0xa0..=0xbf | 0xd9..=0xdb => "string",
        0xc0 => "nil",
        0xc2 | 0xc3 => "boolean",
        0xc4..=0xc6 => "bin",
        0xca | 0xcb => "float",
        0xc7..=0xc9 | 0xd4..=0xd8 => "ext",
        _ => "reserved marker 0xc1",
    }
}

impl<'a> Reader<'a> {
    /// Starts reading at the first byte of `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    /// Current offset from the start of the document.
    pub fn offset(&self) -> usize {
        self.pos
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if self.remaining() < n {
            return Err(WireError::Truncated { offset: self.pos, needed: n - self.remaining() });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    /// Reads an `n`-byte big-endian number, `n <= 8`: one copy into a fixed 8-byte array
    /// instead of a shift per byte.
    fn be(&mut self, n: usize) -> Result<u64, WireError> {
        debug_assert!(n <= 8);
        let s = self.take(n)?;
        let mut b = [0u8; 8];
        b[8 - s.len()..].copy_from_slice(s);
        Ok(u64::from_be_bytes(b))
    }

    /// The next marker byte, without consuming it.
    pub fn peek(&self) -> Result<u8, WireError> {
        // A `match`, not `ok_or`: that built (and dropped) the error at every byte read.
        match self.buf.get(self.pos) {
            Some(&b) => Ok(b),
            None => Err(WireError::Truncated { offset: self.pos, needed: 1 }),
        }
    }

    fn mismatch(&self, field: &'static str, expected: &'static str) -> WireError {
        let found = self.peek().map(marker_name).unwrap_or("end of input");
        WireError::Type { field, expected, found, offset: self.pos }
    }

    /// Consumes a nil if one is next; returns whether it did.
    pub fn eat_nil(&mut self) -> Result<bool, WireError> {
        if self.peek()? == 0xc0 {
            self.pos += 1;
            return Ok(true);
        }
        Ok(false)
    }

    /// Reads an array header.
    pub fn array_len(&mut self, field: &'static str) -> Result<usize, WireError> {
        let len = match self.peek()? {
            m @ 0x90..=0x9f => {
                self.pos += 1;
                u64::from(m & 0x0f)
            }
            0xdc => {
                self.pos += 1;
                self.be(2)?
            }
            0xdd => {
                self.pos += 1;
                self.be(4)?
            }
            _ => return Err(self.mismatch(field, "array")),
        };
        self.bounded_len(len, 1)
    }

    /// Reads a map header.
    pub fn map_len(&mut self, field: &'static str) -> Result<usize, WireError> {
        let len = match self.peek()? {
            m @ 0x80..=0x8f => {
                self.pos += 1;
                u64::from(m & 0x0f)
            }
            0xde => {
                self.pos += 1;
                self.be(2)?
            }
            0xdf => {
                self.pos += 1;
                self.be(4)?
            }
            _ => return Err(self.mismatch(field, "map")),
        };
        self.bounded_len(len, 2)
    }

    /// Rejects a container length that cannot fit in the bytes left (each element takes at least
    /// one byte), so a hostile header cannot make callers reserve huge buffers.
    fn bounded_len(&self, len: u64, bytes_per_item: u64) -> Result<usize, WireError> {
        let need = len.saturating_mul(bytes_per_item);
        if need > self.remaining() as u64 {
            let needed = usize::try_from(need).unwrap_or(usize::MAX) - self.remaining();
            return Err(WireError::Truncated { offset: self.pos, needed });
        }
        Ok(len as usize)
    }

    /// Reads a string's bytes (not checked for UTF-8).
    pub fn str_bytes(&mut self, field: &'static str) -> Result<&'a [u8], WireError> {
        let len = match self.peek()? {
            m @ 0xa0..=0xbf => {
                self.pos += 1;
                usize::from(m & 0x1f)
            }
            0xd9 => {
                self.pos += 1;
                self.be(1)? as usize
            }
            0xda => {
                self.pos += 1;
                self.be(2)? as usize
            }
            0xdb => {
                self.pos += 1;
                self.be(4)? as usize
            }
            _ => return Err(self.mismatch(field, "string")),
        };
        self.take(len)
    }

    /// Reads a bin's bytes.
    pub fn bin_bytes(&mut self, field: &'static str) -> Result<&'a [u8], WireError> {
        let len = match self.peek()? {
            0xc4 => {
                self.pos += 1;
                self.be(1)? as usize
            }
            0xc5 => {
                self.pos += 1;
                self.be(2)? as usize
            }
            0xc6 => {
                self.pos += 1;
                self.be(4)? as usize
            }
            _ => return Err(self.mismatch(field, "bin")),
        };
        self.take(len)
    }

    /// Whether the next value is a bin.
    pub fn at_bin(&self) -> bool {
        matches!(self.peek(), Ok(0xc4..=0xc6))
    }

    /// Reads any integer format.
    pub fn int(&mut self, field: &'static str) -> Result<Int, WireError> {
        let m = self.peek()?;
        let v = match m {
            0x00..=0x7f => {
                self.pos += 1;
                Int::U(u64::from(m))
            }
            0xe0..=0xff => {
                self.pos += 1;
                Int::I(i64::from(m as i8))
            }
            0xcc..=0xcf => {
                self.pos += 1;
                Int::U(self.be(1 << (m - 0xcc))?)
            }
            0xd0..=0xd3 => {
                self.pos += 1;
                let n = 1usize << (m - 0xd0);
                let raw = self.be(n)?;
                let shift = 64 - 8 * n as u32;
                let v = ((raw << shift) as i64) >> shift;
                if v >= 0 {
                    Int::U(v as u64)
                } else {
                    Int::I(v)
                }
            }
            _ => return Err(self.mismatch(field, "integer")),
        };
        Ok(v)
    }

    /// Fills `out` from the front with the token ids that follow, as long as each is a
    /// non-negative integer of at most 32 bits that fits in `i32` (positive fixint, uint8,
    /// uint16, uint32 up to `i32::MAX`), and returns how many it filled. It stops without
    /// consuming anything at the first value it does not take, or when fewer than 8 bytes are
    /// left, so the caller's general path reads that value and reports any error exactly as it
    /// would have.
    ///
    /// This is the decoder's hot loop (token ids are 90 % of a batch's bytes). It is bound by
    /// the chain "marker -> length -> next marker", so it loads 8 bytes per id and takes the
    /// next marker out of that word by a shift instead of a second dependent load; widths come
    /// from arithmetic, not branches, because uint16 and uint32 ids alternate at random.
    pub fn i32_fill(&mut self, out: &mut [i32]) -> usize {
        let buf = self.buf;
        let mut pos = self.pos;
        let Some(&first) = buf.get(pos) else { return 0 };
        let mut m = first; // always buf[pos]
        let mut filled = 0;
        for slot in out.iter_mut() {
            let Some(&win) = buf.get(pos..).and_then(|r| r.first_chunk::<8>()) else { break };
            let w = u64::from_le_bytes(win);
            let k = usize::from(m).wrapping_sub(0xcc);
            let (v, bits) = if k < 3 {
                // uint8, uint16, uint32: 2, 3, 5 bytes = 16, 24, 40 bits.
                let bits = (k * 12 + 16) & !7;
                let payload = ((w >> 8) as u32).swap_bytes(); // bytes 1..5, big-endian
                (payload >> (40 - bits), bits)
            } else if m < 0x80 {
                (u32::from(m), 8)
            } else {
                break;
            };
            let Ok(v) = i32::try_from(v) else { break };
            *slot = v;
            pos += bits / 8;
            m = (w >> bits) as u8;
            filled += 1;
        }
        self.pos = pos;
        filled
    }

    /// Reads a float or an integer as `f64`.
    pub fn number(&mut self, field: &'static str) -> Result<f64, WireError> {
        match self.peek()? {
            0xca => {
                self.pos += 1;
                Ok(f64::from(f32::from_bits(self.be(4)? as u32)))
            }
            0xcb => {
                self.pos += 1;
                Ok(f64::from_bits(self.be(8)?))
            }
            _ => match self.int(field) {
                Ok(Int::U(u)) => Ok(u as f64),
                Ok(Int::I(i)) => Ok(i as f64),
                Err(WireError::Type { field, found, offset, .. }) => {
                    Err(WireError::Type { field, expected: "number", found, offset })
                }
                Err(e) => Err(e),
            },
        }
    }

    /// Skips one value of any type, following at most [`MAX_DEPTH`] levels of nesting.
    pub fn skip(&mut self) -> Result<(), WireError> {
        self.skip_at(0)
    }

    fn skip_at(&mut self, depth: usize) -> Result<(), WireError> {
        if depth >= MAX_DEPTH {
            return Err(WireError::TooDeep { limit: MAX_DEPTH, offset: self.pos });
        }
        let m = self.peek()?;
        match m {
            0x80..=0x8f | 0xde | 0xdf => {
                let n = self.map_len("value")?;
                for _ in 0..n * 2 {
                    self.skip_at(depth + 1)?;
                }
            }
            0x90..=0x9f | 0xdc | 0xdd => {
                let n = self.array_len("value")?;
                for _ in 0..n {
                    self.skip_at(depth + 1)?;
                }
            }
            0xa0..=0xbf | 0xd9..=0xdb => {
                self.str_bytes("value")?;
            }
            0xc4..=0xc6 => {
                self.bin_bytes("value")?;
            }
            0xc0 | 0xc2 | 0xc3 | 0x00..=0x7f | 0xe0..=0xff => self.pos += 1,
            0xca..=0xd3 => {
                let n = match m {
                    0xca => 4,
                    0xcb => 8,
                    0xcc..=0xcf => 1 << (m - 0xcc),
                    _ => 1 << (m - 0xd0),
                };
                self.pos += 1;
                self.take(n)?;
            }
            0xd4..=0xd8 => {
                self.pos += 1;
                self.take(1 + (1 << (m - 0xd4)))?;
            }
            0xc7..=0xc9 => {
                self.pos += 1;
                let n = self.be(1 << (m - 0xc7))? as usize;
                self.take(1usize.saturating_add(n))?;
            }
            0xc1 => return Err(self.mismatch("value", "a valid MessagePack marker")),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_round_trip_in_every_width() {
        let values =
            [0i64, 1, 127, 128, 255, 256, 65535, 65536, -1, -32, -33, -128, -129, i64::MIN];
        for v in values {
            let mut w = Writer::new();
            w.int(v);
            let got = Reader::new(&w.buf).int("v").unwrap();
            let want = if v >= 0 { Int::U(v as u64) } else { Int::I(v) };
            assert_eq!(got, want, "value {v}");
        }
        let mut w = Writer::new();
        w.uint(u64::MAX);
        assert_eq!(Reader::new(&w.buf).int("v").unwrap(), Int::U(u64::MAX));
    }

    #[test]
    fn i32_fill_takes_small_ids_and_leaves_the_rest_to_the_general_path() {
        let ids = [0i64, 127, 128, 255, 256, 65_535, 65_536, i64::from(i32::MAX), 5];
        let mut w = Writer::new();
        ids.iter().for_each(|v| w.int(*v));
        w.int(-1);
        w.uint(u64::from(u32::MAX));
        w.uint(7);
        let buf = w.buf;
        let mut out = [0i32; 16];
        let mut r = Reader::new(&buf);
        let n = r.i32_fill(&mut out);
        assert_eq!(n, ids.len());
        assert!(out[..n].iter().zip(ids).all(|(got, want)| i64::from(*got) == want));
        assert_eq!(r.i32_fill(&mut out), 0, "a negative id is not taken");
        assert_eq!(r.int("t").unwrap(), Int::I(-1));
        assert_eq!(r.i32_fill(&mut out), 0, "nor one above i32::MAX");
        assert_eq!(r.int("t").unwrap(), Int::U(u64::from(u32::MAX)));
        assert_eq!(r.i32_fill(&mut out), 0, "nor anything in the last 8 bytes");
        assert_eq!(r.int("t").unwrap(), Int::U(7));
        let mut r = Reader::new(&buf);
        assert_eq!(r.i32_fill(&mut out[..2]), 2, "stops when `out` is full");
        assert_eq!(r.int("t").unwrap(), Int::U(128));
    }

    #[test]
    fn skip_passes_over_nested_values_and_stops_hostile_depth() {
        let mut w = Writer::new();
        w.map(2);
        w.str("a");
        w.array(3);
        w.f64(1.5);
        w.bin(&[1, 2, 3]);
        w.nil();
        w.str("b");
        w.int(-1000);
        w.uint(7);
        let mut r = Reader::new(&w.buf);
        r.skip().unwrap();
        assert_eq!(r.int("tail").unwrap(), Int::U(7));

        let deep = vec![0x91u8; 100];
        let err = Reader::new(&deep).skip().unwrap_err();
        assert!(matches!(err, WireError::TooDeep { .. }), "{err}");
    }

    #[test]
    fn a_huge_declared_length_is_truncation_not_an_allocation() {
        let buf = [0xdd, 0xff, 0xff, 0xff, 0xff, 0x01];
        let err = Reader::new(&buf).array_len("events").unwrap_err();
        assert!(matches!(err, WireError::Truncated { .. }), "{err}");
    }

    #[test]
    fn type_mismatch_names_field_and_found_type() {
        let err = Reader::new(&[0xa1, b'x']).array_len("events").unwrap_err();
        assert_eq!(err.to_string(), "events: expected array, found string at offset 0");
    }
}
