//! What a frame's text holds, read without parsing it: its payloads by tag ([`contents`], one
//! vectorised scan for `[`) and its id from its last bytes ([`tail_id`]). The light subscribers
//! (`light.rs`) read every frame this way, and the tally (`tally.rs`) counts what it found: a
//! file of its own so that neither needs the other.

/// What one frame holds, by its payloads' tags.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Contents {
    pub data: u64,
    pub begins: u64,
    pub commits: u64,
    /// Byte offset of the last `["commit"` in the frame.
    pub last_commit: Option<usize>,
}

impl Contents {
    /// Payloads (messages) in the frame.
    pub fn msgs(&self) -> u64 {
        self.data + self.begins + self.commits
    }
}

/// The payloads of a frame's text, by tag, from one scan for `[` (memchr's, 16-32 bytes at a
/// time) and a look at the bytes after each.
///
/// Why it is exact: a payload starts `["<tag>"`. A `[` inside a JSON string followed by `"` is
/// that string's end, and a string's closing quote is followed by `,` `:` `}` or `]`, never by a
/// letter: so `["data"` outside a payload's head can only be a nested array whose first element
/// is the string `data`, and the generator's rows (`crate::workload`: flat objects of an id, a
/// number and letters) hold none. A data payload has two `[` (its head and its relation's key
/// columns), a begin or a commit one: a handful of hits per payload, against ~170 bytes read.
/// Counting with `memmem` instead (`["data"`, then `["commit"`) reads the frame twice and finds
/// no begin.
pub fn contents(text: &str) -> Contents {
    let b = text.as_bytes();
    let mut c = Contents::default();
    for i in memchr::memchr_iter(b'[', b) {
        let after = &b[i + 1..];
        if after.starts_with(br#""data""#) {
            c.data += 1;
        } else if after.starts_with(br#""commit""#) {
            c.commits += 1;
            c.last_commit = Some(i);
        } else if after.starts_with(br#""begin""#) {
            c.begins += 1;
        }
    }
    c
}

/// The id of a frame of either shape (`{"msg":P,"id":N}`, `{"batch":[…],"id":N}`) read from its
/// last bytes: the outer object's last member is `"id":N` when the text ends `,"id":N}`, since a
/// nested object or string would end it with `}}` or `"}`. `None` for any other tail.
pub fn tail_id(text: &str) -> Option<u64> {
    let b = text.strip_suffix('}')?.as_bytes();
    let digits = b.iter().rev().take_while(|c| c.is_ascii_digit()).count();
    if digits == 0 || digits >= 20 {
        return None;
    }
    let (head, n) = b.split_at(b.len() - digits);
    if !head.ends_with(br#","id":"#) {
        return None;
    }
    n.iter().try_fold(0u64, |v, &d| {
        v.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })
}
