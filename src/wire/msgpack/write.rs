//! The MessagePack writer: appends values to a `Vec<u8>`, always in the smallest format, for the
//! encoders that the simulator and tests use.

/// Appends MessagePack values to a `Vec<u8>`, always in the smallest format.
#[derive(Debug, Default)]
pub struct Writer {
    /// The encoded bytes so far.
    pub buf: Vec<u8>,
}

impl Writer {
    /// A writer over an empty buffer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Writes an array header.
    pub fn array(&mut self, len: usize) {
        self.container(len, 0x90, 0xdc);
    }

    /// Writes a map header.
    pub fn map(&mut self, len: usize) {
        self.container(len, 0x80, 0xde);
    }

    fn container(&mut self, len: usize, fix: u8, m16: u8) {
        if len < 16 {
            self.buf.push(fix | len as u8);
        } else if len <= 0xffff {
            self.buf.push(m16);
            self.buf.extend_from_slice(&(len as u16).to_be_bytes());
        } else {
            self.buf.push(m16 + 1);
            self.buf.extend_from_slice(&(len as u32).to_be_bytes());
        }
    }

    /// Writes a nil.
    pub fn nil(&mut self) {
        self.buf.push(0xc0);
    }

    /// Writes a string.
    pub fn str(&mut self, s: &str) {
        let len = s.len();
        if len < 32 {
            self.buf.push(0xa0 | len as u8);
        } else if len <= 0xff {
            self.buf.extend_from_slice(&[0xd9, len as u8]);
        } else if len <= 0xffff {
            self.buf.push(0xda);
            self.buf.extend_from_slice(&(len as u16).to_be_bytes());
        } else {
            self.buf.push(0xdb);
            self.buf.extend_from_slice(&(len as u32).to_be_bytes());
        }
        self.buf.extend_from_slice(s.as_bytes());
    }

    /// Writes a bin.
    pub fn bin(&mut self, b: &[u8]) {
        let len = b.len();
        if len <= 0xff {
            self.buf.extend_from_slice(&[0xc4, len as u8]);
        } else if len <= 0xffff {
            self.buf.push(0xc5);
            self.buf.extend_from_slice(&(len as u16).to_be_bytes());
        } else {
            self.buf.push(0xc6);
            self.buf.extend_from_slice(&(len as u32).to_be_bytes());
        }
        self.buf.extend_from_slice(b);
    }

    /// Writes an unsigned integer.
    pub fn uint(&mut self, v: u64) {
        if v < 0x80 {
            self.buf.push(v as u8);
        } else if v <= 0xff {
            self.buf.extend_from_slice(&[0xcc, v as u8]);
        } else if v <= 0xffff {
            self.buf.push(0xcd);
            self.buf.extend_from_slice(&(v as u16).to_be_bytes());
        } else if v <= 0xffff_ffff {
            self.buf.push(0xce);
            self.buf.extend_from_slice(&(v as u32).to_be_bytes());
        } else {
            self.buf.push(0xcf);
            self.buf.extend_from_slice(&v.to_be_bytes());
        }
    }

    /// Writes a signed integer.
    pub fn int(&mut self, v: i64) {
        if v >= 0 {
            self.uint(v as u64);
        } else if v >= -32 {
            self.buf.push(v as i8 as u8);
        } else if v >= i64::from(i8::MIN) {
            self.buf.extend_from_slice(&[0xd0, v as i8 as u8]);
        } else if v >= i64::from(i16::MIN) {
            self.buf.push(0xd1);
            self.buf.extend_from_slice(&(v as i16).to_be_bytes());
        } else if v >= i64::from(i32::MIN) {
            self.buf.push(0xd2);
            self.buf.extend_from_slice(&(v as i32).to_be_bytes());
        } else {
            self.buf.push(0xd3);
            self.buf.extend_from_slice(&v.to_be_bytes());
        }
    }

    /// Writes a 64-bit float.
    pub fn f64(&mut self, v: f64) {
        self.buf.push(0xcb);
        self.buf.extend_from_slice(&v.to_bits().to_be_bytes());
    }
}
