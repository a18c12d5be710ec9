// GPT-2 tokenizer, decode direction only: a table from token id to its bytes (llm.c format:
// header [0]=20240328 [1]=2 [2]=vocab size [3]=EOT id, then per token a uint8 length and bytes).
#ifndef LLMC_TOKENIZER_H
#define LLMC_TOKENIZER_H

#include <ctype.h>
#include <stdint.h>
#include "utils.h"

#define TOKENIZER_MAGIC 20240328

typedef struct {
    int vocab_size;
    int eot_token;
    char** tokens;  // NUL-terminated bytes of each token
} Tokenizer;

static inline void tokenizer_init(Tokenizer* tok, const char* path) {
    FILE* f = fopen_check(path, "rb");
    int header[256];
    fread_check(header, sizeof(int), 256, f, path);
    if (header[0] != TOKENIZER_MAGIC) {
        fail("tokenizer file '%s' has magic number %d, expected %d", path, header[0],
             TOKENIZER_MAGIC);
    }
    if (header[1] != 2) fail("tokenizer file '%s' has version %d, expected 2", path, header[1]);
    tok->vocab_size = header[2];
    tok->eot_token = header[3];
    if (tok->vocab_size <= 0 || tok->vocab_size > (1 << 24) || tok->eot_token < 0 || tok->eot_token >= tok->vocab_size) {
        fail("tokenizer file '%s' has %d tokens with end-of-text id %d: expected 1..2^24 tokens "
             "and an id among them", path, tok->vocab_size, tok->eot_token);
    }
    tok->tokens = (char**)malloc_check((size_t)tok->vocab_size * sizeof(char*));
    for (int i = 0; i < tok->vocab_size; i++) {
        unsigned char len;
        fread_check(&len, 1, 1, f, path);
        tok->tokens[i] = (char*)malloc_check((size_t)len + 1);
        fread_check(tok->tokens[i], 1, len, f, path);
        tok->tokens[i][len] = '\0';
    }
    fclose(f);
}

static inline const char* tokenizer_decode(const Tokenizer* tok, int id) {
    if (id < 0 || id >= tok->vocab_size) return "<?>";
    return tok->tokens[id];
}

// prints a token, skipping the control bytes a terminal would act on
static inline void tokenizer_print(const Tokenizer* tok, int id) {
    const char* s = tokenizer_decode(tok, id);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (isprint(ch) || isspace(ch) || ch >= 0x80) putchar(ch);
    }
}

static inline void tokenizer_free(Tokenizer* tok) {
    for (int i = 0; i < tok->vocab_size; i++) free(tok->tokens[i]);
    free(tok->tokens);
}

#endif
