//! Stop strings matched on the decoded text as it streams: a stop string may span tokens, so
//! text that could still be the start of one is held back until it is known not to be; the stop
//! string itself is never given out.

/// What one piece of text gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopOutcome {
    /// No stop string yet: this text is safe to give out (maybe empty).
    Continue(String),
    /// A stop string was found: this is the text before it, and generation ends.
    Stopped(String),
}

/// Matches stop strings across pieces of text.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

impl StopMatcher {
    /// A matcher for `stops` (empty strings are ignored).
    pub fn new(stops: Vec<String>) -> Self {
        StopMatcher {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
        }
    }

    /// Adds the next piece of text.
    pub fn push(&mut self, text: &str) -> StopOutcome {
        if self.stops.is_empty() {
            return StopOutcome::Continue(text.to_owned());
        }
        self.held.push_str(text);
        let first = self
            .stops
            .iter()
            .filter_map(|stop| self.held.find(stop.as_str()))
            .min();
        if let Some(at) = first {
            let before = self.held[..at].to_owned();
            self.held.clear();
            return StopOutcome::Stopped(before);
        }
        // Hold the longest tail that some stop string begins with.
        let keep_from = self
            .held
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| {
                let tail = &self.held[i..];
                self.stops.iter().any(|stop| stop.starts_with(tail))
            })
            .unwrap_or(self.held.len());
        let out = self.held[..keep_from].to_owned();
        self.held.drain(..keep_from);
        StopOutcome::Continue(out)
    }

    /// Ends the text: what was held back is no stop string after all.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `pieces` and gives back (text out, whether it stopped).
    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in pieces {
            match m.push(p) {
                StopOutcome::Continue(t) => out.push_str(&t),
                StopOutcome::Stopped(t) => {
                    out.push_str(&t);
                    return (out, true);
                }
            }
        }
        out.push_str(&m.finish());
        (out, false)
    }

    #[test]
    fn a_stop_string_across_pieces_ends_the_text_before_it() {
        assert_eq!(
            run(&["END"], &["hello E", "N", "D world"]),
            ("hello ".into(), true)
        );
        assert_eq!(run(&["\n\n"], &["a\n", "\nb"]), ("a".into(), true));
        assert_eq!(
            run(&["xyz"], &["xy"]),
            ("xy".into(), false),
            "held text comes out at the end"
        );
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), false));
    }

    #[test]
    fn text_is_held_only_while_it_may_start_a_stop_string() {
        let mut m = StopMatcher::new(vec!["abc".into()]);
        assert_eq!(m.push("xxab"), StopOutcome::Continue("xx".into()));
        assert_eq!(m.push("d"), StopOutcome::Continue("abd".into()));
        assert_eq!(m.push("a"), StopOutcome::Continue("".into()));
        assert_eq!(m.push("abc"), StopOutcome::Stopped("a".into()));
    }

    #[test]
    fn the_earliest_of_several_stop_strings_wins_and_characters_stay_whole() {
        assert_eq!(
            run(&["world", "lo w"], &["hello world"]),
            ("hel".into(), true)
        );
        // A multi-byte character that starts a stop string is held whole, never cut.
        let mut m = StopMatcher::new(vec!["éé".into()]);
        assert_eq!(m.push("aé"), StopOutcome::Continue("a".into()));
        assert_eq!(m.push("b"), StopOutcome::Continue("éb".into()));
        assert_eq!(run(&["🦀!"], &["x🦀", "🦀", "!"]), ("x🦀".into(), true));
    }
}
