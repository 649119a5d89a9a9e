//! Token parity: what kvdir's text side computes for a chat request equals what an engine
//! computes, checked against token lists built independently in the test (the conversation
//! rendered by hand in ChatML and encoded with the `tokenizers` crate directly).

use kvdir_text::demo::{self, IM_END, IM_START};
use kvdir_text::{TextError, TextModel};
use serde_json::json;
use tokenizers::Tokenizer;

/// The demo model in a temporary directory, removed when the returned value drops.
fn model_dir() -> tempfile::TempDir {
    let dir = tempfile::Builder::new().prefix("kvdir-text-").tempdir().unwrap();
    demo::write_model(dir.path()).unwrap();
    dir
}

#[test]
fn a_rendered_conversation_tokenizes_as_the_engine_would() {
    let dir = model_dir();
    let dir = dir.path();
    let model = TextModel::load(dir, None).unwrap();
    let messages = json!([
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": [{"type": "text", "text": "And of"}, {"type": "text", "text": "Spain?"}]},
    ]);
    let prompt = model.chat_prompt(&messages, None, true).unwrap();
    let ids = model.encode(&prompt, false).unwrap();

    let by_hand = format!(
        "{IM_START}system\nYou are a helpful assistant.{IM_END}\n\
         {IM_START}user\nWhat is the capital of France?{IM_END}\n\
         {IM_START}assistant\nParis.{IM_END}\n\
         {IM_START}user\nAnd of\nSpain?{IM_END}\n\
         {IM_START}assistant\n"
    );
    assert_eq!(prompt, by_hand);
    let raw = Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    let expected = raw.encode(by_hand.as_str(), false).unwrap().get_ids().to_vec();
    assert_eq!(ids, expected);

    // The special tokens are single ids, at the places ChatML puts them.
    let start = model.token_id(IM_START).unwrap();
    assert_eq!(ids[0], start);
    assert_eq!(ids.iter().filter(|&&t| t == start).count(), 5);
    assert_eq!(*ids.last().unwrap(), raw.encode("\n", false).unwrap().get_ids()[0]);
    // Byte-level BPE round-trips the text.
    assert_eq!(raw.decode(&ids, false).unwrap(), by_hand);
}

#[test]
fn a_shared_system_prompt_gives_a_shared_token_prefix() {
    let model = TextModel::load(model_dir().path(), None).unwrap();
    let system = json!({"role": "system", "content": demo::CORPUS.lines().take(8).collect::<Vec<_>>().join(" ")});
    let ask = |q: &str| {
        let m = json!([system, {"role": "user", "content": q}]);
        model.encode(&model.chat_prompt(&m, None, true).unwrap(), false).unwrap()
    };
    let (a, b) = (ask("First question?"), ask("Another one entirely."));
    let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let system_only =
        model.encode(&model.chat_prompt(&json!([system]), None, false).unwrap(), false).unwrap();
    assert!(common >= system_only.len(), "common {common}, system prompt {}", system_only.len());
    assert!(system_only.len() > 64, "the demo tokenizer compresses text: {}", system_only.len());
}

#[test]
fn template_errors_and_missing_files_name_the_problem() {
    let dir = model_dir();
    let dir = dir.path();
    let raising = dir.join("raising.jinja");
    std::fs::write(&raising, "{{ raise_exception('roles must alternate') }}").unwrap();
    let model = TextModel::load(dir, Some(&raising)).unwrap();
    let err = model.chat_prompt(&json!([]), None, true).unwrap_err();
    assert!(err.to_string().contains("roles must alternate"), "{err}");

    let image =
        json!([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]);
    let err = TextModel::load(dir, None).unwrap().chat_prompt(&image, None, true).unwrap_err();
    assert!(err.to_string().contains("image_url"), "{err}");

    let missing = dir.join("nope");
    let err = TextModel::load(&missing, None).unwrap_err();
    assert!(matches!(err, TextError::Read { .. }), "{err}");
    assert!(err.to_string().contains("nope"), "{err}");

    std::fs::write(dir.join("tokenizer_config.json"), "{}").unwrap();
    let plain = TextModel::load(dir, None).unwrap();
    assert!(!plain.has_chat_template());
    let err = plain.chat_prompt(&json!([]), None, true).unwrap_err();
    assert!(err.to_string().contains("--chat_template"), "{err}");
    // Plain completion prompts still tokenize.
    assert!(!plain.encode("hello world", true).unwrap().is_empty());
}

/// Texts mixing corpus sentences, ChatML tokens, whitespace runs and non-ASCII, long enough
/// that the pieces between tokens are remembered; deterministic.
fn mixed_texts(n: usize) -> Vec<String> {
    let lines: Vec<&str> = demo::CORPUS.lines().collect();
    let extras = [IM_START, IM_END, demo::BOS, "\n", "  ", "\t", "é→ü 漢字 ", "<|im", "_end|>"];
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move |m: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % m as u64) as usize
    };
    (0..n)
        .map(|_| {
            let mut t = String::new();
            for _ in 0..(4 + next(24)) {
                match next(3) {
                    0 => t.push_str(extras[next(extras.len())]),
                    _ => t.push_str(lines[next(lines.len())]),
                }
            }
            t
        })
        .collect()
}

#[test]
fn remembered_pieces_give_exactly_the_tokenizers_ids() {
    let dir = model_dir();
    let dir = dir.path();
    let model = TextModel::load(dir, None).unwrap();
    assert!(model.caches_segments(), "ChatML's added tokens split plainly");
    let raw = Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    let texts = mixed_texts(300);
    for round in 0..2 {
        for t in &texts {
            let expected = raw.encode(t.as_str(), false).unwrap().get_ids().to_vec();
            assert_eq!(model.encode(t, false).unwrap(), expected, "round {round}: {t:?}");
        }
    }
    // A long shared system prompt: the second request reuses its piece and still matches.
    let system = demo::CORPUS.repeat(4);
    for q in ["first?", "second!"] {
        let m = json!([{"role": "system", "content": system}, {"role": "user", "content": q}]);
        let text = model.chat_prompt(&m, None, true).unwrap();
        let expected = raw.encode(text.as_str(), false).unwrap().get_ids().to_vec();
        assert_eq!(model.encode(&text, false).unwrap(), expected);
    }
}
