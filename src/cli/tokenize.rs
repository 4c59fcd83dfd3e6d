//! `onepass tokenize`: show the token ids of a text.

use clap::Args;
use onepass::model::tokenizer::Tokenizer;

use super::common::{open_model, ModelArgs};

/// Flags of `tokenize`.
#[derive(Args, Debug)]
pub struct TokenizeArgs {
    /// The text.
    pub text: String,
    #[command(flatten)]
    pub model: ModelArgs,
    /// Print `{"ids": [...], "tokens": [...]}`.
    #[arg(long)]
    pub json: bool,
}

/// Runs `tokenize`.
pub fn run(args: TokenizeArgs) -> anyhow::Result<()> {
    let file = open_model(&args.model.model)?;
    let tok = Tokenizer::from_gguf(&file)?;
    let ids = tok.encode(&args.text, true)?;
    let tokens: Vec<String> = ids
        .iter()
        .map(|&i| tok.token_str(i).unwrap_or_default().to_string())
        .collect();
    if args.json {
        println!("{}", serde_json::json!({ "ids": ids, "tokens": tokens }));
    } else {
        for (id, t) in ids.iter().zip(&tokens) {
            println!("{id:>8}  {t:?}");
        }
        eprintln!("{} tokens", ids.len());
    }
    Ok(())
}
