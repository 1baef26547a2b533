;; The two loops of the records hot paths that V8 has no fast native for (protocol/json-kernels.ts
;; loads them; scripts/build-kernels.mjs builds this file with wabt's wat2wasm; every output is
;; held identical to JSON.stringify and to the UTF-8 decoder by test/unit/lossless-json.test.ts):
;;
;; * escape(src, units, dst) → dst end: a string's UTF-16 code units (as Buffer#write(s,
;;   'utf16le') lays them out) → the UTF-8 body of its JSON string literal, byte for byte what
;;   JSON.stringify writes: \" \\ \b \f \n \r \t, other controls \u00xx, lone surrogates \udxxx.
;;   16 units per step while they need nothing.
;; * asciify(src, len, dst, limit) → dst end, or -1: valid UTF-8 JSON text → the same JSON with
;;   every non-ASCII character written \uXXXX (non-ASCII occurs only inside strings), so it
;;   decodes as Latin-1 at memcpy speed and JSON.parse gives the same value. -1 once the output
;;   passes `limit` (dense non-ASCII: the native decoder is then the better choice).
;;
;; Both store 16 bytes at a time ahead of what they keep: the caller leaves 64 bytes of slack
;; past the largest output. Bytes 0..1023 of the memory are this module's tables.
(module
  (import "k" "memory" (memory 1))

  ;; 0..127: the letter of an ASCII character's two-character escape (0: it takes \u00xx).
  (data (i32.const 8) "btn\00fr") ;; \b \t \n, 11 has none, \f \r
  (data (i32.const 34) "\22")
  (data (i32.const 92) "\5c")
  ;; 128..143: hex digits, lowercase as JSON.stringify writes them.
  (data (i32.const 128) "0123456789abcdef")

  ;; \uXXXX for the code unit `x` at dst; the new end.
  (func $unicode_escape (param $dst i32) (param $x i32) (result i32)
    (i32.store8 (local.get $dst) (i32.const 0x5c))
    (i32.store8 offset=1 (local.get $dst) (i32.const 0x75))
    (i32.store8 offset=2 (local.get $dst) (i32.load8_u offset=128 (i32.and (i32.shr_u (local.get $x) (i32.const 12)) (i32.const 15))))
    (i32.store8 offset=3 (local.get $dst) (i32.load8_u offset=128 (i32.and (i32.shr_u (local.get $x) (i32.const 8)) (i32.const 15))))
    (i32.store8 offset=4 (local.get $dst) (i32.load8_u offset=128 (i32.and (i32.shr_u (local.get $x) (i32.const 4)) (i32.const 15))))
    (i32.store8 offset=5 (local.get $dst) (i32.load8_u offset=128 (i32.and (local.get $x) (i32.const 15))))
    (i32.add (local.get $dst) (i32.const 6)))

  ;; A UTF-8 continuation byte: the six bits of `value` from `shift` up.
  (func $continuation (param $value i32) (param $shift i32) (result i32)
    (i32.or (i32.and (i32.shr_u (local.get $value) (local.get $shift)) (i32.const 0x3f)) (i32.const 0x80)))

  (func (export "escape") (param $src i32) (param $units i32) (param $dst i32) (result i32)
    (local $end i32) (local $flagged i32) (local $u i32) (local $letter i32) (local $low i32) (local $cp i32) (local $v v128)
    (local.set $end (i32.add (local.get $src) (i32.shl (local.get $units) (i32.const 1))))
    (block $done
      (loop $next
        (if (i32.le_u (i32.add (local.get $src) (i32.const 32)) (local.get $end))
          (then
            ;; 16 units → 16 bytes (saturating narrow: a unit ≥ 0x8000 becomes 0), stored at
            ;; once; flagged: every unit that is not ASCII (high bit set, or 0) or needs an escape.
            (local.set $v (i8x16.narrow_i16x8_u (v128.load (local.get $src)) (v128.load offset=16 (local.get $src))))
            (v128.store (local.get $dst) (local.get $v))
            (local.set $flagged
              (i32.or
                (i8x16.bitmask (local.get $v))
                (i8x16.bitmask
                  (v128.or
                    (v128.or
                      (i8x16.lt_u (local.get $v) (i8x16.splat (i32.const 0x20)))
                      (i8x16.eq (local.get $v) (i8x16.splat (i32.const 0x22))))
                    (i8x16.eq (local.get $v) (i8x16.splat (i32.const 0x5c)))))))
            (if (i32.eqz (local.get $flagged))
              (then
                (local.set $src (i32.add (local.get $src) (i32.const 32)))
                (local.set $dst (i32.add (local.get $dst) (i32.const 16)))
                (br $next)))
            ;; Keep the plain units before the first flagged one; that one goes the slow way below.
            (local.set $flagged (i32.ctz (local.get $flagged)))
            (local.set $dst (i32.add (local.get $dst) (local.get $flagged)))
            (local.set $src (i32.add (local.get $src) (i32.shl (local.get $flagged) (i32.const 1)))))
          (else
            (br_if $done (i32.ge_u (local.get $src) (local.get $end)))))
        ;; One unit.
        (local.set $u (i32.load16_u (local.get $src)))
        (local.set $src (i32.add (local.get $src) (i32.const 2)))
        (if (i32.lt_u (local.get $u) (i32.const 0x80))
          (then
            (if (i32.and
                  (i32.ge_u (local.get $u) (i32.const 0x20))
                  (i32.and (i32.ne (local.get $u) (i32.const 0x22)) (i32.ne (local.get $u) (i32.const 0x5c))))
              (then
                (i32.store8 (local.get $dst) (local.get $u))
                (local.set $dst (i32.add (local.get $dst) (i32.const 1))))
              (else
                (local.set $letter (i32.load8_u (local.get $u)))
                (if (local.get $letter)
                  (then
                    (i32.store8 (local.get $dst) (i32.const 0x5c))
                    (i32.store8 offset=1 (local.get $dst) (local.get $letter))
                    (local.set $dst (i32.add (local.get $dst) (i32.const 2))))
                  (else
                    (local.set $dst (call $unicode_escape (local.get $dst) (local.get $u))))))))
          (else
            (if (i32.lt_u (local.get $u) (i32.const 0x800))
              (then
                (i32.store8 (local.get $dst) (i32.or (i32.shr_u (local.get $u) (i32.const 6)) (i32.const 0xc0)))
                (i32.store8 offset=1 (local.get $dst) (call $continuation (local.get $u) (i32.const 0)))
                (local.set $dst (i32.add (local.get $dst) (i32.const 2))))
              (else
                (if (i32.ne (i32.and (local.get $u) (i32.const 0xf800)) (i32.const 0xd800))
                  (then
                    (i32.store8 (local.get $dst) (i32.or (i32.shr_u (local.get $u) (i32.const 12)) (i32.const 0xe0)))
                    (i32.store8 offset=1 (local.get $dst) (call $continuation (local.get $u) (i32.const 6)))
                    (i32.store8 offset=2 (local.get $dst) (call $continuation (local.get $u) (i32.const 0)))
                    (local.set $dst (i32.add (local.get $dst) (i32.const 3))))
                  (else
                    ;; A surrogate. A high one followed by a low one is a pair; anything else is lone.
                    (local.set $low (i32.const 0))
                    (if (i32.and (i32.lt_u (local.get $u) (i32.const 0xdc00)) (i32.lt_u (local.get $src) (local.get $end)))
                      (then (local.set $low (i32.load16_u (local.get $src)))))
                    (if (i32.eq (i32.and (local.get $low) (i32.const 0xfc00)) (i32.const 0xdc00))
                      (then
                        (local.set $cp
                          (i32.add
                            (i32.or
                              (i32.shl (i32.sub (local.get $u) (i32.const 0xd800)) (i32.const 10))
                              (i32.sub (local.get $low) (i32.const 0xdc00)))
                            (i32.const 0x10000)))
                        (i32.store8 (local.get $dst) (i32.or (i32.shr_u (local.get $cp) (i32.const 18)) (i32.const 0xf0)))
                        (i32.store8 offset=1 (local.get $dst) (call $continuation (local.get $cp) (i32.const 12)))
                        (i32.store8 offset=2 (local.get $dst) (call $continuation (local.get $cp) (i32.const 6)))
                        (i32.store8 offset=3 (local.get $dst) (call $continuation (local.get $cp) (i32.const 0)))
                        (local.set $dst (i32.add (local.get $dst) (i32.const 4)))
                        (local.set $src (i32.add (local.get $src) (i32.const 2))))
                      (else
                        (local.set $dst (call $unicode_escape (local.get $dst) (local.get $u)))))))))))
        (br $next)))
    (local.get $dst))

  (func (export "asciify") (param $src i32) (param $len i32) (param $dst i32) (param $limit i32) (result i32)
    (local $end i32) (local $skip i32) (local $b i32) (local $cp i32) (local $v v128)
    (local.set $end (i32.add (local.get $src) (local.get $len)))
    (block $done
      (loop $next
        (if (i32.le_u (i32.add (local.get $src) (i32.const 16)) (local.get $end))
          (then
            ;; 16 bytes copied at once; a byte with its high bit set starts or continues a
            ;; non-ASCII character.
            (local.set $v (v128.load (local.get $src)))
            (v128.store (local.get $dst) (local.get $v))
            (local.set $skip (i8x16.bitmask (local.get $v)))
            (if (i32.eqz (local.get $skip))
              (then
                (local.set $src (i32.add (local.get $src) (i32.const 16)))
                (local.set $dst (i32.add (local.get $dst) (i32.const 16)))
                (br $next)))
            (local.set $skip (i32.ctz (local.get $skip)))
            (local.set $src (i32.add (local.get $src) (local.get $skip)))
            (local.set $dst (i32.add (local.get $dst) (local.get $skip))))
          (else
            (br_if $done (i32.ge_u (local.get $src) (local.get $end)))))
        (local.set $b (i32.load8_u (local.get $src)))
        (if (i32.lt_u (local.get $b) (i32.const 0x80))
          (then
            (i32.store8 (local.get $dst) (local.get $b))
            (local.set $dst (i32.add (local.get $dst) (i32.const 1)))
            (local.set $src (i32.add (local.get $src) (i32.const 1)))
            (br $next)))
        ;; The character this lead byte starts (the caller checked the text is valid UTF-8).
        (if (i32.lt_u (local.get $b) (i32.const 0xe0))
          (then
            (local.set $cp
              (i32.or
                (i32.shl (i32.and (local.get $b) (i32.const 0x1f)) (i32.const 6))
                (i32.and (i32.load8_u offset=1 (local.get $src)) (i32.const 0x3f))))
            (local.set $src (i32.add (local.get $src) (i32.const 2))))
          (else
            (if (i32.lt_u (local.get $b) (i32.const 0xf0))
              (then
                (local.set $cp
                  (i32.or
                    (i32.or
                      (i32.shl (i32.and (local.get $b) (i32.const 0x0f)) (i32.const 12))
                      (i32.shl (i32.and (i32.load8_u offset=1 (local.get $src)) (i32.const 0x3f)) (i32.const 6)))
                    (i32.and (i32.load8_u offset=2 (local.get $src)) (i32.const 0x3f))))
                (local.set $src (i32.add (local.get $src) (i32.const 3))))
              (else
                (local.set $cp
                  (i32.or
                    (i32.or
                      (i32.shl (i32.and (local.get $b) (i32.const 0x07)) (i32.const 18))
                      (i32.shl (i32.and (i32.load8_u offset=1 (local.get $src)) (i32.const 0x3f)) (i32.const 12)))
                    (i32.or
                      (i32.shl (i32.and (i32.load8_u offset=2 (local.get $src)) (i32.const 0x3f)) (i32.const 6))
                      (i32.and (i32.load8_u offset=3 (local.get $src)) (i32.const 0x3f)))))
                (local.set $src (i32.add (local.get $src) (i32.const 4)))))))
        ;; As \uXXXX, or a surrogate pair of them past the Basic Multilingual Plane.
        (if (i32.lt_u (local.get $cp) (i32.const 0x10000))
          (then
            (local.set $dst (call $unicode_escape (local.get $dst) (local.get $cp))))
          (else
            (local.set $cp (i32.sub (local.get $cp) (i32.const 0x10000)))
            (local.set $dst (call $unicode_escape (local.get $dst) (i32.add (i32.const 0xd800) (i32.shr_u (local.get $cp) (i32.const 10)))))
            (local.set $dst (call $unicode_escape (local.get $dst) (i32.add (i32.const 0xdc00) (i32.and (local.get $cp) (i32.const 0x3ff)))))))
        (if (i32.gt_u (local.get $dst) (local.get $limit))
          (then (return (i32.const -1))))
        (br $next)))
    (local.get $dst))
)
