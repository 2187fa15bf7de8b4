//! Maps field paths (`schedulingProfiles[0].plugins[2].pluginRef`) to their
//! line and column in the YAML text, so semantic errors found after
//! deserialisation can still point at the source.

use std::collections::HashMap;

use saphyr_parser::{Event, Parser};

enum Frame {
    Map { key: Option<String> },
    Seq { index: usize },
}

/// Positions of every node by path (1-based line and column). For a mapping
/// entry the position is the key's.
#[derive(Debug, Default)]
pub(crate) struct Locations(HashMap<String, (usize, usize)>);

impl Locations {
    pub(crate) fn scan(text: &str) -> Self {
        let mut out = HashMap::new();
        let mut stack: Vec<Frame> = Vec::new();
        let mut parser = Parser::new_from_str(text);
        while let Some(Ok((event, span))) = parser.next_event() {
            let pos = (span.start.line(), span.start.col() + 1);
            let is_node = matches!(
                event,
                Event::Scalar(..)
                    | Event::SequenceStart(..)
                    | Event::MappingStart(..)
                    | Event::Alias(_)
            );
            // A scalar where a mapping expects a key is that key.
            if let (Event::Scalar(value, ..), Some(Frame::Map { key: key @ None })) =
                (&event, stack.last_mut())
            {
                *key = Some(value.to_string());
                let path = path_of(&stack);
                out.entry(path).or_insert(pos);
                continue;
            }
            if is_node {
                out.entry(path_of(&stack)).or_insert(pos);
            }
            match event {
                Event::MappingStart(..) => stack.push(Frame::Map { key: None }),
                Event::SequenceStart(..) => stack.push(Frame::Seq { index: 0 }),
                Event::MappingEnd | Event::SequenceEnd => {
                    stack.pop();
                }
                _ => {}
            }
            let completes_value = match event {
                Event::MappingStart(..) | Event::SequenceStart(..) => false,
                Event::MappingEnd | Event::SequenceEnd => true,
                _ => is_node,
            };
            if completes_value {
                advance(&mut stack);
            }
        }
        Self(out)
    }

    /// Position of `path`, or of its nearest located ancestor.
    pub(crate) fn find(&self, path: &str) -> Option<(usize, usize)> {
        let mut p = path;
        loop {
            if let Some(&pos) = self.0.get(p) {
                return Some(pos);
            }
            let cut = p.rfind(['.', '['])?;
            p = &p[..cut];
        }
    }
}

/// After a value completes: a mapping waits for its next key, a sequence
/// moves to its next index.
fn advance(stack: &mut [Frame]) {
    match stack.last_mut() {
        Some(Frame::Map { key }) => *key = None,
        Some(Frame::Seq { index }) => *index += 1,
        None => {}
    }
}

fn path_of(stack: &[Frame]) -> String {
    let mut p = String::new();
    for f in stack {
        match f {
            Frame::Map { key: Some(k) } => {
                if !p.is_empty() {
                    p.push('.');
                }
                p.push_str(k);
            }
            Frame::Map { key: None } => {}
            Frame::Seq { index } => {
                p.push('[');
                p.push_str(&index.to_string());
                p.push(']');
            }
        }
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_point_at_lines_and_columns() {
        let text = "plugins:\n- type: a\n  name: x\n- {type: b, parameters: {k: 1}}\nprofiles:\n  - name: p\n    plugins:\n    - pluginRef: x\n";
        let l = Locations::scan(text);
        assert_eq!(l.find("plugins"), Some((1, 1)));
        assert_eq!(l.find("plugins[0].type"), Some((2, 3)));
        assert_eq!(l.find("plugins[0].name"), Some((3, 3)));
        assert_eq!(l.find("plugins[1].type"), Some((4, 4)));
        assert_eq!(l.find("plugins[1].parameters.k"), Some((4, 26)));
        assert_eq!(l.find("profiles[0].plugins[0].pluginRef"), Some((8, 7)));
        assert_eq!(
            l.find("profiles[0].plugins[0].weight"),
            Some((8, 7)),
            "falls back to the parent"
        );
    }
}
