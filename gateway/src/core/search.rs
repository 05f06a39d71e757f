//! Tool search: the tools matching a query, best first. The one ranking behind `tool_search`
//! on `/mcp` and `/search/mcp` and behind a coding task's `tool_search()`.
//!
//! The query is cut into words (lowercase letters and digits); a tool scores for each word
//! found among the words of its name (`get_quote` has `get` and `quote`), then inside its
//! name, among the words of its title, then of its description (or at a word's beginning),
//! the first place found counting most. Tools matching no word
//! are left out; ties go by name. An empty query matches every tool.

use std::sync::Arc;

use crate::catalog::Tool;

/// Score of a query word that is a word of the tool's name.
const NAME_WORD: u32 = 8;
/// ... that is part of the name.
const IN_NAME: u32 = 4;
/// ... that is a word of the title.
const TITLE_WORD: u32 = 3;
/// ... that is a word (or a word's beginning) of the description.
const DESCRIPTION_WORD: u32 = 1;
/// Shortest query word matched inside a name or at the beginning of a word (shorter ones
/// match whole words only: "at" is not found in "market").
const MIN_PART: usize = 3;

/// The words of `text`: runs of letters and digits, lowercase.
pub fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()).map(str::to_lowercase).collect()
}

fn score(query: &[String], tool: &Tool) -> u32 {
    let name = tool.name().to_lowercase();
    let name_words = words(&name);
    let title_words = words(tool.spec.title.as_deref().unwrap_or_default());
    let description_words = words(&tool.spec.description);
    query
        .iter()
        .map(|w| {
            if name_words.contains(w) {
                NAME_WORD
            } else if w.len() >= MIN_PART && name.contains(w.as_str()) {
                IN_NAME
            } else if title_words.contains(w) {
                TITLE_WORD
            } else if description_words.iter().any(|d| d == w || (w.len() >= MIN_PART && d.starts_with(w.as_str()))) {
                DESCRIPTION_WORD
            } else {
                0
            }
        })
        .sum()
}

/// The tools of `tools` matching `query`, best first.
pub fn rank(query: &str, tools: Vec<Arc<Tool>>) -> Vec<Arc<Tool>> {
    let query = words(query);
    let mut scored: Vec<(u32, Arc<Tool>)> = tools
        .into_iter()
        .map(|t| (if query.is_empty() { 1 } else { score(&query, &t) }, t))
        .filter(|(s, _)| *s > 0)
        .collect();
    scored.sort_by(|(a, x), (b, y)| b.cmp(a).then_with(|| x.name().cmp(y.name())));
    scored.into_iter().map(|(_, t)| t).collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn tool(name: &str, title: &str, description: &str) -> Arc<Tool> {
        let spec = serde_json::from_value(json!({
            "name": name, "title": title, "description": description, "inputSchema": {"type": "object"},
            "runtime": {"image": "i", "command": ["x"]},
        }))
        .unwrap();
        Arc::new(Tool::new(String::new(), name.replace('_', "-"), 1, spec).unwrap())
    }

    #[test]
    fn names_rank_above_titles_and_descriptions_and_unmatched_tools_are_left_out() {
        let tools = vec![
            tool("stress_test", "Stress scenarios", "Applies shocks to a portfolio; reports the worst loss"),
            tool("historical_var", "Value at risk", "Historical VaR and expected shortfall of a portfolio"),
            tool("price_option", "Price an option", "Black-Scholes price of a European option"),
            tool("market_data_get_quote", "", "Last price of a ticker"),
        ];
        let names = |q: &str| rank(q, tools.clone()).iter().map(|t| t.name().to_owned()).collect::<Vec<_>>();
        assert_eq!(names("price"), ["price_option", "market_data_get_quote"]);
        assert_eq!(names("quote"), ["market_data_get_quote"]);
        assert_eq!(names("portfolio var"), ["historical_var", "stress_test"]);
        assert_eq!(names("Value-at-Risk"), ["historical_var"]);
        assert!(names("nothing matches this").is_empty());
        assert_eq!(names("").len(), 4, "an empty query lists every tool");
    }
}
