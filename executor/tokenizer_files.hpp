// Which tokenizer a path holds, read from the files a Hugging Face checkpoint ships, no LibTorch.
//
// load_tokenizer(path) accepts
//   - a folder: vocab.txt (BERT's WordPiece), vocab.json + merges.txt (RoBERTa's byte-level BPE)
//     or tokenizer.json (the fast-tokenizer file). When a folder holds both a two-file form and
//     tokenizer.json, the two files are read: they are the vocabulary itself, with nothing else
//     to interpret, whereas tokenizer.json may add normalizers and options Loom does not run
//     (the two files of a Hugging Face checkpoint are what its tokenizer.json was made from). A
//     folder with both vocab.txt and vocab.json is refused as ambiguous: name the file.
//   - a file: a .json file whose object has a "model" key is a tokenizer.json, another .json file
//     is a vocab.json (merges.txt beside it), merges.txt means the vocab.json beside it, and any
//     other file is a WordPiece vocab.txt.
// tokenizer.json is read for a BPE model ("type": "BPE", "vocab", "merges" as "a b" strings or
// ["a", "b"] pairs) with the ByteLevel pre-tokenizer and no normalizer, and for a WordPiece model
// ("type": "WordPiece", "vocab", continuing prefix "##") with the BertNormalizer; its
// "added_tokens" complete the vocabulary. Anything else is an InputError saying that the
// two-file form (vocab.json + merges.txt, or vocab.txt) is needed.
//
// WordPiece lower-cases as Hugging Face's BertTokenizer does by default, unless the folder's
// tokenizer_config.json says "do_lower_case": false (bert-base-cased) or, without that file,
// tokenizer.json's BertNormalizer says "lowercase": false.
//
// files() of the result lists the files read plus the folder's tokenizer_config.json and
// special_tokens_map.json when present: what an exported model folder copies so that Hugging
// Face loads the same tokenizer. Errors (missing, unreadable or malformed files, missing special
// tokens) throw InputError naming the file and the field.
#pragma once

#include <memory>
#include <string>

#include "executor/tokenizer.hpp"

namespace loom::executor {

// The tokenizer `path` holds (see above).
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);

// The tokenizer of a tokenizer.json file.
std::unique_ptr<Tokenizer> load_tokenizer_json(const std::string& path);

// True when `folder` is a folder holding vocab.txt, vocab.json or tokenizer.json.
bool holds_tokenizer(const std::string& folder);

}  // namespace loom::executor
