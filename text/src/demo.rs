//! A small model directory made by the project itself, for the demo and the tests: a
//! byte-level BPE trained with the `tokenizers` crate's trainer on [`CORPUS`] (text written for
//! kvdir), ChatML special tokens, and [`CHATML_TEMPLATE`], a Jinja chat template written for
//! kvdir in the common ChatML shape.
//!
//! Training is deterministic for a given corpus and vocabulary size, so the same files come out
//! every time.

use std::path::Path;

use serde_json::json;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::models::TrainerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, Tokenizer};

use crate::TextError;

/// The training text, shipped with the crate.
pub const CORPUS: &str = include_str!("../data/corpus.txt");

/// Start of a ChatML turn.
pub const IM_START: &str = "<|im_start|>";
/// End of a ChatML turn; also the model's end-of-sequence token.
pub const IM_END: &str = "<|im_end|>";
/// Beginning of text, prepended to plain completion prompts by the post-processor.
pub const BOS: &str = "<|endoftext|>";

/// The demo model's chat template.
pub const CHATML_TEMPLATE: &str = concat!(
    "{% if tools %}{{ '<|im_start|>system\\nTools: ' + (tools | tojson) + '<|im_end|>\\n' }}{% endif %}",
    "{% for message in messages %}",
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}",
    "{% endfor %}",
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
);

/// Vocabulary size of the demo tokenizer.
pub const VOCAB_SIZE: usize = 1024;

/// Trains the demo tokenizer; returns its `tokenizer.json` text.
pub fn train_tokenizer(corpus: &str, vocab_size: usize) -> Result<String, TextError> {
    let err = |e: tokenizers::Error| TextError::Encode(e.to_string());
    let specials: Vec<AddedToken> =
        [BOS, IM_START, IM_END].iter().map(|t| AddedToken::from(*t, true)).collect();
    let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
        .vocab_size(vocab_size)
        .min_frequency(2)
        .show_progress(false)
        .special_tokens(specials.clone())
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build()
        .into();
    let mut tokenizer = Tokenizer::new(BPE::default());
    tokenizer.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
    tokenizer.with_decoder(Some(ByteLevelDecoder::default()));
    tokenizer.train(&mut trainer, corpus.lines()).map_err(err)?;
    tokenizer.add_special_tokens(&specials);
    tokenizer.to_string(true).map_err(err)
}

/// Writes `tokenizer.json` and `tokenizer_config.json` (with [`CHATML_TEMPLATE`]) into `dir`.
pub fn write_model(dir: &Path) -> Result<(), TextError> {
    let write = |name: &str, text: String| {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|source| TextError::Read { path, source })
    };
    std::fs::create_dir_all(dir)
        .map_err(|source| TextError::Read { path: dir.to_path_buf(), source })?;
    write("tokenizer.json", train_tokenizer(CORPUS, VOCAB_SIZE)?)?;
    let config = json!({
        "bos_token": BOS,
        "eos_token": IM_END,
        "chat_template": CHATML_TEMPLATE,
        "model_max_length": 32768,
    });
    write("tokenizer_config.json", serde_json::to_string_pretty(&config).unwrap_or_default())
}
