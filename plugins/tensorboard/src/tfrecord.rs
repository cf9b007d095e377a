//! TFRecord framing: `u64 length | masked crc32c(length) | data | masked crc32c(data)`,
//! all little-endian. Each record costs the same whatever the file already holds.

use std::io::{self, Read, Write};

const MASK_DELTA: u32 = 0xA282_EAD8;

/// TensorFlow masks CRCs so that a CRC of data that itself contains CRCs stays strong.
pub fn masked_crc(data: &[u8]) -> u32 {
    let crc = crc32c::crc32c(data);
    crc.rotate_right(15).wrapping_add(MASK_DELTA)
}

/// Bytes of framing around each record.
pub const OVERHEAD: usize = 16;

pub fn write_record(out: &mut impl Write, data: &[u8]) -> io::Result<()> {
    let len = (data.len() as u64).to_le_bytes();
    let mut header = [0u8; 12];
    header[..8].copy_from_slice(&len);
    header[8..].copy_from_slice(&masked_crc(&len).to_le_bytes());
    out.write_all(&header)?;
    out.write_all(data)?;
    out.write_all(&masked_crc(data).to_le_bytes())
}

/// Reads every record, failing on a bad CRC or a truncated record (unlike
/// TensorBoard's loader, which stops silently). For tests and tools.
pub fn read_records(mut input: impl Read) -> io::Result<Vec<Vec<u8>>> {
    let invalid = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
    let mut records = Vec::new();
    loop {
        let mut header = [0u8; 12];
        match input.read(&mut header[..1])? {
            0 => return Ok(records),
            _ => input.read_exact(&mut header[1..])?,
        }
        let len_bytes: [u8; 8] = header[..8].try_into().expect("8 bytes");
        let stored = u32::from_le_bytes(header[8..].try_into().expect("4 bytes"));
        if stored != masked_crc(&len_bytes) {
            return Err(invalid(format!("record {}: bad length CRC", records.len())));
        }
        let mut data = vec![0u8; u64::from_le_bytes(len_bytes) as usize];
        input.read_exact(&mut data)?;
        let mut crc = [0u8; 4];
        input.read_exact(&mut crc)?;
        if u32::from_le_bytes(crc) != masked_crc(&data) {
            return Err(invalid(format!("record {}: bad data CRC", records.len())));
        }
        records.push(data);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_is_castagnoli() {
        // The CRC-32C check value from the Rocksoft catalogue (RFC 3720 B.4).
        assert_eq!(crc32c::crc32c(b"123456789"), 0xE306_9283);
    }

    #[test]
    // Spelled as TensorFlow's crc32c.h spells it, independently of `rotate_right`.
    #[allow(clippy::manual_rotate)]
    fn mask_rotates_right_by_15_and_adds_the_delta() {
        let crc = crc32c::crc32c(b"123456789");
        let expected = ((crc >> 15) | (crc << 17)).wrapping_add(0xA282_EAD8);
        assert_eq!(masked_crc(b"123456789"), expected);
        // The mask of the empty string's CRC (0) is the delta itself.
        assert_eq!(masked_crc(b""), MASK_DELTA);
    }

    #[test]
    fn a_record_is_length_crc_data_crc() {
        let mut out = Vec::new();
        write_record(&mut out, b"hello").unwrap();
        assert_eq!(out.len(), 5 + OVERHEAD);
        assert_eq!(&out[..8], &5u64.to_le_bytes());
        assert_eq!(&out[8..12], &masked_crc(&5u64.to_le_bytes()).to_le_bytes());
        assert_eq!(&out[12..17], b"hello");
        assert_eq!(&out[17..], &masked_crc(b"hello").to_le_bytes());
    }

    #[test]
    fn records_round_trip_and_corruption_is_an_error() {
        let mut out = Vec::new();
        for r in [&b""[..], b"a", &[7u8; 1000]] {
            write_record(&mut out, r).unwrap();
        }
        let back = read_records(&out[..]).unwrap();
        assert_eq!(back, vec![Vec::new(), b"a".to_vec(), vec![7u8; 1000]]);

        let mut flipped = out.clone();
        flipped[OVERHEAD + 12] ^= 1; // inside the second record's data
        assert!(read_records(&flipped[..]).is_err());
        assert!(read_records(&out[..out.len() - 1]).is_err(), "a truncated record is an error");
    }
}
