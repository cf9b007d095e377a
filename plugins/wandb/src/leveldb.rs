//! The framing of a `.wandb` file: a 7-byte W&B header, then LevelDB's log format.
//! The file is cut into 32 KiB blocks (the header counts towards the first); each
//! record is one or more chunks `crc32 u32 | length u16 | type u8 | data`, never
//! crossing a block boundary, and a block tail too short for a chunk header is
//! zero-filled. The CRC is plain IEEE CRC-32 over the type byte and the data.

use std::io::{self, Write};

pub const BLOCK: usize = 32 * 1024;
pub const CHUNK_HEADER: usize = 7;
/// `:W&B`, magic 0xBEE1 little-endian, version 0.
pub const FILE_HEADER: [u8; 7] = [b':', b'W', b'&', b'B', 0xE1, 0xBE, 0];

const FULL: u8 = 1;
const FIRST: u8 = 2;
const MIDDLE: u8 = 3;
const LAST: u8 = 4;

pub fn chunk_crc(kind: u8, data: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&[kind]);
    hasher.update(data);
    hasher.finalize()
}

pub struct LogWriter<W: Write> {
    out: W,
    /// Bytes written into the current block.
    in_block: usize,
}

impl<W: Write> LogWriter<W> {
    pub fn new(mut out: W) -> io::Result<LogWriter<W>> {
        out.write_all(&FILE_HEADER)?;
        Ok(LogWriter { out, in_block: FILE_HEADER.len() })
    }

    pub fn append(&mut self, mut data: &[u8]) -> io::Result<()> {
        let mut first = true;
        loop {
            let left = BLOCK - self.in_block;
            if left < CHUNK_HEADER {
                self.out.write_all(&[0u8; CHUNK_HEADER][..left])?;
                self.in_block = 0;
                continue;
            }
            let n = data.len().min(left - CHUNK_HEADER);
            let last = n == data.len();
            let kind = match (first, last) {
                (true, true) => FULL,
                (true, false) => FIRST,
                (false, false) => MIDDLE,
                (false, true) => LAST,
            };
            let mut header = [0u8; CHUNK_HEADER];
            header[..4].copy_from_slice(&chunk_crc(kind, &data[..n]).to_le_bytes());
            header[4..6].copy_from_slice(&(n as u16).to_le_bytes());
            header[6] = kind;
            self.out.write_all(&header)?;
            self.out.write_all(&data[..n])?;
            self.in_block += CHUNK_HEADER + n;
            data = &data[n..];
            first = false;
            if last {
                return Ok(());
            }
        }
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    pub fn get_mut(&mut self) -> &mut W {
        &mut self.out
    }
}

/// Reads every record back, checking every CRC and chunk sequence. For tests.
pub fn read_log(bytes: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    if bytes.len() < FILE_HEADER.len() || bytes[..FILE_HEADER.len()] != FILE_HEADER {
        return Err("missing the :W&B header".into());
    }
    let (mut pos, mut records, mut partial): (usize, Vec<Vec<u8>>, Option<Vec<u8>>) = (FILE_HEADER.len(), Vec::new(), None);
    while pos < bytes.len() {
        let left = BLOCK - pos % BLOCK;
        if left < CHUNK_HEADER {
            if bytes[pos..(pos + left).min(bytes.len())].iter().any(|&b| b != 0) {
                return Err(format!("non-zero block padding at {pos}"));
            }
            pos += left;
            continue;
        }
        let header = bytes.get(pos..pos + CHUNK_HEADER).ok_or(format!("truncated chunk header at {pos}"))?;
        let crc = u32::from_le_bytes(header[..4].try_into().expect("4 bytes"));
        let len = u16::from_le_bytes([header[4], header[5]]) as usize;
        let kind = header[6];
        if CHUNK_HEADER + len > left {
            return Err(format!("chunk at {pos} crosses a block boundary"));
        }
        let data = bytes.get(pos + CHUNK_HEADER..pos + CHUNK_HEADER + len).ok_or(format!("truncated chunk at {pos}"))?;
        if chunk_crc(kind, data) != crc {
            return Err(format!("bad CRC at {pos}"));
        }
        match (kind, partial.take()) {
            (FULL, None) => records.push(data.to_vec()),
            (FIRST, None) => partial = Some(data.to_vec()),
            (MIDDLE, Some(mut p)) => {
                p.extend_from_slice(data);
                partial = Some(p);
            }
            (LAST, Some(mut p)) => {
                p.extend_from_slice(data);
                records.push(p);
            }
            (kind, _) => return Err(format!("unexpected chunk type {kind} at {pos}")),
        }
        pos += CHUNK_HEADER + len;
    }
    match partial {
        Some(_) => Err("the last record is incomplete".into()),
        None => Ok(records),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(records: &[Vec<u8>]) -> Vec<u8> {
        let mut w = LogWriter::new(Vec::new()).unwrap();
        for r in records {
            w.append(r).unwrap();
        }
        w.out
    }

    /// (type, length) of each chunk, walking the blocks.
    fn chunks(bytes: &[u8]) -> Vec<(u8, usize)> {
        let (mut pos, mut out) = (FILE_HEADER.len(), Vec::new());
        while pos < bytes.len() {
            let left = BLOCK - pos % BLOCK;
            if left < CHUNK_HEADER {
                pos += left;
                continue;
            }
            let len = u16::from_le_bytes([bytes[pos + 4], bytes[pos + 5]]) as usize;
            out.push((bytes[pos + 6], len));
            pos += CHUNK_HEADER + len;
        }
        out
    }

    #[test]
    fn the_crc_is_ieee_crc32_over_type_and_data() {
        // The CRC-32 (IEEE, zlib) check value.
        assert_eq!(crc32fast::hash(b"123456789"), 0xCBF4_3926);
        let mut typed = vec![FULL];
        typed.extend_from_slice(b"123456789");
        assert_eq!(chunk_crc(FULL, b"123456789"), crc32fast::hash(&typed));
    }

    #[test]
    fn a_small_record_is_one_full_chunk_after_the_header() {
        let bytes = write(&[b"abc".to_vec()]);
        assert_eq!(&bytes[..7], b":W&B\xe1\xbe\x00");
        assert_eq!(&bytes[7..11], &chunk_crc(FULL, b"abc").to_le_bytes());
        assert_eq!(&bytes[11..], &[3, 0, FULL, b'a', b'b', b'c']);
    }

    #[test]
    fn a_record_larger_than_a_block_spans_first_middle_last() {
        let big: Vec<u8> = (0..2 * BLOCK + 100).map(|i| (i % 251) as u8).collect();
        let bytes = write(std::slice::from_ref(&big));
        let first = BLOCK - FILE_HEADER.len() - CHUNK_HEADER;
        let middle = BLOCK - CHUNK_HEADER;
        assert_eq!(chunks(&bytes), vec![(FIRST, first), (MIDDLE, middle), (LAST, big.len() - first - middle)]);
        assert_eq!(read_log(&bytes).unwrap(), vec![big]);
    }

    #[test]
    fn a_block_tail_shorter_than_a_chunk_header_is_zero_padded() {
        // Leave exactly 6 bytes in the first block, then write a small record.
        let fill = BLOCK - FILE_HEADER.len() - CHUNK_HEADER - 6;
        let bytes = write(&[vec![1u8; fill], b"next".to_vec()]);
        assert_eq!(&bytes[BLOCK - 6..BLOCK], &[0u8; 6]);
        assert_eq!(bytes[BLOCK + 6], FULL, "the next record starts the next block");
        assert_eq!(read_log(&bytes).unwrap(), vec![vec![1u8; fill], b"next".to_vec()]);
    }

    #[test]
    fn exactly_a_chunk_header_left_gets_an_empty_first_chunk() {
        let fill = BLOCK - FILE_HEADER.len() - CHUNK_HEADER - CHUNK_HEADER;
        let bytes = write(&[vec![2u8; fill], b"xy".to_vec()]);
        assert_eq!(chunks(&bytes), vec![(FULL, fill), (FIRST, 0), (LAST, 2)]);
        assert_eq!(read_log(&bytes).unwrap()[1], b"xy");
    }

    #[test]
    fn records_ending_on_the_block_boundary_need_no_padding() {
        let fill = BLOCK - FILE_HEADER.len() - CHUNK_HEADER;
        let bytes = write(&[vec![3u8; fill], b"z".to_vec()]);
        assert_eq!(bytes.len(), BLOCK + CHUNK_HEADER + 1);
        assert_eq!(chunks(&bytes), vec![(FULL, fill), (FULL, 1)]);
    }

    #[test]
    fn many_records_round_trip_and_a_flipped_bit_is_caught() {
        let records: Vec<Vec<u8>> = (0..500).map(|i| vec![(i % 256) as u8; (i * 37) % 900]).collect();
        let mut bytes = write(&records);
        assert_eq!(read_log(&bytes).unwrap(), records);
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x40;
        assert!(read_log(&bytes).is_err());
    }
}
