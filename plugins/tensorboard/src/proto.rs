//! The subset of TensorFlow's `event.proto` / `summary.proto` that TensorBoard
//! reads, written out by hand so the crate builds without `protoc`. Field numbers
//! are TensorFlow's; unknown fields are simply never written.

use prost::{Message, Oneof};

#[derive(Clone, PartialEq, Message)]
pub struct Event {
    #[prost(double, tag = "1")]
    pub wall_time: f64,
    #[prost(int64, tag = "2")]
    pub step: i64,
    #[prost(oneof = "What", tags = "3, 5, 7")]
    pub what: Option<What>,
}

#[derive(Clone, PartialEq, Oneof)]
pub enum What {
    #[prost(string, tag = "3")]
    FileVersion(String),
    #[prost(message, tag = "5")]
    Summary(Summary),
    // 7 in TensorBoard's event.proto (6 is the deprecated `log_message`, which
    // readers do not act on).
    #[prost(message, tag = "7")]
    SessionLog(SessionLog),
}

/// `SessionLog.status = START` tells readers a run restarted at this step: they
/// drop what earlier files logged at or after it (the steps a resumed run redoes).
#[derive(Clone, PartialEq, Message)]
pub struct SessionLog {
    #[prost(int32, tag = "1")]
    pub status: i32,
}

pub const SESSION_START: i32 = 1;

#[derive(Clone, PartialEq, Message)]
pub struct Summary {
    #[prost(message, repeated, tag = "1")]
    pub value: Vec<Value>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Value {
    #[prost(string, tag = "1")]
    pub tag: String,
    #[prost(message, optional, tag = "9")]
    pub metadata: Option<SummaryMetadata>,
    #[prost(oneof = "Kind", tags = "2, 5, 8")]
    pub kind: Option<Kind>,
}

#[derive(Clone, PartialEq, Oneof)]
pub enum Kind {
    #[prost(float, tag = "2")]
    SimpleValue(f32),
    #[prost(message, tag = "5")]
    Histo(HistogramProto),
    #[prost(message, tag = "8")]
    Tensor(TensorProto),
}

#[derive(Clone, PartialEq, Message)]
pub struct HistogramProto {
    #[prost(double, tag = "1")]
    pub min: f64,
    #[prost(double, tag = "2")]
    pub max: f64,
    #[prost(double, tag = "3")]
    pub num: f64,
    #[prost(double, tag = "4")]
    pub sum: f64,
    #[prost(double, tag = "5")]
    pub sum_squares: f64,
    #[prost(double, repeated, tag = "6")]
    pub bucket_limit: Vec<f64>,
    #[prost(double, repeated, tag = "7")]
    pub bucket: Vec<f64>,
}

#[derive(Clone, PartialEq, Message)]
pub struct SummaryMetadata {
    #[prost(message, optional, tag = "1")]
    pub plugin_data: Option<PluginData>,
}

#[derive(Clone, PartialEq, Message)]
pub struct PluginData {
    #[prost(string, tag = "1")]
    pub plugin_name: String,
    #[prost(bytes = "vec", tag = "2")]
    pub content: Vec<u8>,
}

/// `DataType.DT_STRING` in `types.proto`.
pub const DT_STRING: i32 = 7;

#[derive(Clone, PartialEq, Message)]
pub struct TensorProto {
    #[prost(int32, tag = "1")]
    pub dtype: i32,
    /// Absent means a scalar (rank 0), which is what the text plugin expects.
    #[prost(message, optional, tag = "2")]
    pub tensor_shape: Option<TensorShapeProto>,
    #[prost(bytes = "vec", repeated, tag = "8")]
    pub string_val: Vec<Vec<u8>>,
}

#[derive(Clone, PartialEq, Message)]
pub struct TensorShapeProto {}

impl Value {
    pub fn scalar(tag: &str, value: f64) -> Value {
        Value { tag: tag.to_string(), metadata: None, kind: Some(Kind::SimpleValue(value as f32)) }
    }

    pub fn histogram(tag: &str, histo: HistogramProto) -> Value {
        Value { tag: tag.to_string(), metadata: None, kind: Some(Kind::Histo(histo)) }
    }

    /// A string for TensorBoard's text dashboard, which renders it as Markdown.
    pub fn text(tag: &str, markdown: &str) -> Value {
        Value {
            tag: tag.to_string(),
            metadata: Some(SummaryMetadata { plugin_data: Some(PluginData { plugin_name: "text".into(), content: Vec::new() }) }),
            kind: Some(Kind::Tensor(TensorProto {
                dtype: DT_STRING,
                tensor_shape: Some(TensorShapeProto {}),
                string_val: vec![markdown.as_bytes().to_vec()],
            })),
        }
    }
}

impl Event {
    pub fn file_version(wall_time: f64) -> Event {
        Event { wall_time, step: 0, what: Some(What::FileVersion("brain.Event:2".into())) }
    }

    pub fn summary(wall_time: f64, step: u64, value: Vec<Value>) -> Event {
        Event { wall_time, step: step as i64, what: Some(What::Summary(Summary { value })) }
    }

    pub fn session_start(wall_time: f64, step: u64) -> Event {
        Event { wall_time, step: step as i64, what: Some(What::SessionLog(SessionLog { status: SESSION_START })) }
    }
}
