use std::io::Write;

use super::*;

fn write(dir: &Path, name: &str, bytes: &[u8]) -> String {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path.display().to_string()
}

fn read_all(path: &str, format: DataFormat) -> Result<Vec<Record>> {
    let mut rows = Rows::open(path, format, &[])?;
    let mut out = Vec::new();
    loop {
        let batch = rows.next_batch(3)?;
        if batch.is_empty() {
            return Ok(out);
        }
        out.extend(batch);
    }
}

fn texts(rows: &[Record]) -> Vec<(String, String)> {
    rows.iter().map(|r| (r.place.at.to_string(), r.get("a").map(|v| v.to_string()).unwrap_or_default())).collect()
}

const LINES: &str = "{\"a\": \"x\", \"b\": 1}\n\n{\"a\": \"y\"}\r\n{\"a\": \"z\"}";

#[test]
fn json_lines_plain_gzip_and_zstd_with_a_byte_order_mark_read_alike() {
    let dir = tempfile::tempdir().unwrap();
    let plain = write(dir.path(), "plain.jsonl", LINES.as_bytes());
    let bom = write(dir.path(), "bom.jsonl", &[b"\xEF\xBB\xBF".as_slice(), LINES.as_bytes()].concat());
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(LINES.as_bytes()).unwrap();
    let gz = write(dir.path(), "rows.jsonl.gz", &gz.finish().unwrap());
    let zst = write(dir.path(), "rows.jsonl.zst", &zstd::encode_all(LINES.as_bytes(), 3).unwrap());
    let expected = vec![("line 1".into(), "x".into()), ("line 3".into(), "y".into()), ("line 4".into(), "z".into())];
    for path in [plain, bom, gz, zst] {
        let rows = read_all(&path, DataFormat::Auto).unwrap();
        assert_eq!(texts(&rows), expected, "{path}");
        assert_eq!(rows[0].column_names(), "a, b", "columns in the file's order");
    }
}

#[test]
fn a_json_array_is_read_a_row_at_a_time_with_its_lines() {
    let dir = tempfile::tempdir().unwrap();
    let text = "[\n  {\"a\": \"x\", \"s\": \"} ] {\\\" [\"},\n  {\"a\": \"y\",\n   \"n\": [1, {\"k\": 2}]}\n]\n";
    let path = write(dir.path(), "rows.json", text.as_bytes());
    let rows = read_all(&path, DataFormat::Auto).unwrap();
    assert_eq!(texts(&rows), vec![("line 2".into(), "x".into()), ("line 3".into(), "y".into())]);
    // `.json` holding JSON Lines (datasets' to_json) is read as JSON Lines.
    let lines = write(dir.path(), "lines.json", LINES.as_bytes());
    assert_eq!(read_all(&lines, DataFormat::Auto).unwrap().len(), 3);
    let err = read_all(&lines, DataFormat::Json).unwrap_err().to_string();
    assert!(err.contains("line 1: a JSON file of rows must hold one array"), "{err}");
}

#[test]
fn bad_text_is_named_by_line() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, &[u8], &str); 7] = [
        ("utf8.jsonl", b"{\"a\": \"x\"}\n{\"a\": \"\xFF\"}\n", "line 2: not UTF-8 text: an invalid byte (0xFF) at column 8"),
        ("syntax.jsonl", b"{\"a\": \"x\"}\n{oops\n", "line 2: not a JSON object: key must be a string (column 2)"),
        ("list.jsonl", b"[1, 2]\n", "line 1: not a JSON object"),
        ("open.json", b"[{\"a\": \"x\"},\n {\"a\": ", "line 2: the file ends inside a row"),
        ("scalar.json", b"[{\"a\": \"x\"},\n 3]", "line 2: an array element that is not a JSON object"),
        ("utf8.json", b"[{\"a\": \"x\"},\n {\"a\":\n \"\xC3\"}]", "line 3: not UTF-8 text"),
        ("comma.json", b"[{\"a\": \"x\"},\n {\"a\": \"y\"},\n]", "line 3: a comma before the array's closing `]`"),
    ];
    for (name, bytes, expected) in cases {
        let path = write(dir.path(), name, bytes);
        let err = read_all(&path, DataFormat::Auto).unwrap_err().to_string();
        assert!(err.contains(name) && err.contains(expected), "{name}: {err}");
    }
    let whole = whole_utf8(b"\xEF\xBB\xBFab\ncd\xE9f\n").unwrap_err();
    assert_eq!(whole, "line 2: not UTF-8 text: an invalid byte (0xE9) at column 3");
    assert_eq!(whole_utf8(b"\xEF\xBB\xBFab").unwrap(), "ab", "the byte-order mark is skipped");
}

#[test]
fn directories_and_globs_name_their_shards_in_order() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["train-00001-of-00002.jsonl", "train-00000-of-00002.jsonl", "test-00000-of-00001.jsonl"] {
        write(dir.path(), name, b"{\"a\": \"x\"}\n");
    }
    let names = |shards: Vec<Shard>| shards.iter().map(|s| s.path.file_name().unwrap().to_string_lossy().to_string()).collect::<Vec<_>>();
    let train = vec!["train-00000-of-00002.jsonl".to_string(), "train-00001-of-00002.jsonl".into()];
    assert_eq!(names(locate(&dir.path().display().to_string(), DataFormat::Auto).unwrap()), train, "a directory: its train shards");
    assert_eq!(names(locate(&format!("{}/train-*.jsonl", dir.path().display()), DataFormat::Auto).unwrap()), train);
    let err = locate(&format!("{}/nothing-*.jsonl", dir.path().display()), DataFormat::Auto).unwrap_err().to_string();
    assert!(err.contains("no file matches"), "{err}");
    let rows = read_all(&dir.path().display().to_string(), DataFormat::Auto).unwrap();
    assert_eq!(rows.len(), 2);
    assert!(rows[1].place.file.ends_with("train-00001-of-00002.jsonl") && rows[1].place.at == At::Line(1));
}
