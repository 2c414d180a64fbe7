"""The sentencepiece tokenizer a TEN model was trained with, for ``transformers``
(``AutoTokenizer.from_pretrained(folder, trust_remote_code=True)``). It encodes exactly as
the trainer did: no BOS or EOS added, and, where sentencepiece has "\\n" as a piece of its
own, text split into lines, each encoded, joined by that piece.

Its BOS token is the EOS piece: in training every document follows an EOS, and
sentencepiece's own BOS never appears, so a tool that starts a text with the BOS
(lm-evaluation-harness's log-likelihoods, ``generate`` without a prompt) gives the model
the context it was trained on."""

from __future__ import annotations

import os
import shutil

import sentencepiece as spm
from transformers import PreTrainedTokenizer


class TENTokenizer(PreTrainedTokenizer):
    vocab_files_names = {"vocab_file": "tokenizer.model"}
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, vocab_file: str, **kwargs):
        self.vocab_file = vocab_file
        self.sp = spm.SentencePieceProcessor()
        self.sp.Load(vocab_file)
        nl = self.sp.piece_to_id("\n")
        self.newline = "\n" if self.sp.id_to_piece(nl) == "\n" else None
        piece = self.sp.id_to_piece
        eos, unk, pad = self.sp.eos_id(), self.sp.unk_id(), self.sp.pad_id()
        kwargs.setdefault("eos_token", piece(eos))
        kwargs.setdefault("pad_token", piece(pad if pad >= 0 else eos))
        kwargs.setdefault("bos_token", piece(eos))  # what every document follows
        if unk >= 0:
            kwargs.setdefault("unk_token", piece(unk))
        kwargs.setdefault("clean_up_tokenization_spaces", False)
        super().__init__(**kwargs)

    @property
    def vocab_size(self) -> int:
        return self.sp.get_piece_size()

    def get_vocab(self) -> dict[str, int]:
        vocab = {self.sp.id_to_piece(i): i for i in range(self.vocab_size)}
        vocab.update(self.added_tokens_encoder)
        return vocab

    def _tokenize(self, text: str, **kwargs) -> list[str]:
        if self.newline is None:
            return self.sp.encode(text, out_type=str)
        pieces: list[str] = []
        for i, line in enumerate(text.split("\n")):
            if i:
                pieces.append(self.newline)
            pieces += self.sp.encode(line, out_type=str)
        return pieces

    def _convert_token_to_id(self, token: str) -> int:
        return self.sp.piece_to_id(token)

    def _convert_id_to_token(self, index: int) -> str:
        return self.sp.id_to_piece(int(index))

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        return self.sp.decode_pieces(tokens)

    def build_inputs_with_special_tokens(self, token_ids_0, token_ids_1=None):
        return token_ids_0 + (token_ids_1 or [])  # the model was trained on plain text

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None):
        name = (filename_prefix + "-" if filename_prefix else "") + "tokenizer.model"
        out = os.path.join(save_directory, name)
        if os.path.abspath(out) != os.path.abspath(self.vocab_file):
            shutil.copyfile(self.vocab_file, out)
        return (out,)
