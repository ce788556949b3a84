"""Surviving mutants of the mutation benchmark that are equivalent: mutant name -> one-line reason.

A mutant is listed here only when no test can tell it from the released code (the program's
observable behaviour is the same); a mutant a test could kill gets that test instead.
"""

_PJ = "nvfp4study.sglang.patch_journal."
_CREATE_MODE = ("equivalent: os.open's creation mode is replaced at once by the os.chmod(path, mode & 0o7777) "
                "that follows, on a new file in the journal's own folder")
_INDENT = "equivalent: JSON whitespace of journal.json; recover() reads it with json.loads"

_RT = "nvfp4study.checkpoint.roundtrip."

_ISO = "nvfp4study.codeeval.isolation."
_NO_LIB32 = ("equivalent on this machine: /lib32 and /libx32 do not exist here (merged /usr), so the name is "
             "skipped either way; tests/test_sandbox.py::test_bwrap_command_line_inside compares them with the host")
_REAL_DIR = ("equivalent on this machine: merged /usr, /bin /sbin /lib /lib64 are links, so the branch for a real "
             "folder is never taken here; on a machine with one, test_bwrap_command_line_inside checks it")

_DL = "nvfp4study.serving.decode_log."

_ACC = "nvfp4study.serving.acceptance."
_DUMP = ("equivalent for these params: pydantic dumps any mode but 'json' as Python values, and every field is a "
         "str, number, bool, None, list, dict or str enum, which json.dumps writes as the JSON mode does")

_CSV = "nvfp4study.checkpoint.check_scale_values."
_MOST = "equivalent: most_common(n)[0] is the most common value for any n >= 1 or None"

_R05 = "nvfp4study.stages.claim_rules.r05_corruption."

EQUIVALENT: dict[str, str] = {
    # checkpoint/check_scale_values.py
    _CSV + "x_check_scale_values__mutmut_39": _MOST,
    _CSV + "x_check_scale_values__mutmut_41": _MOST,
    _CSV + "x_value_problem__mutmut_13": "equivalent: v <= 0 for v < 0 after `v == 0` has returned 'zero' (-0.0 too)",
    # serving/acceptance.py
    _ACC + "x_session_delta__mutmut_3": "equivalent: found = None for False, only read as a truth value",
    _ACC + "x_broken_draft_result__mutmut_170": ("equivalent: a missing speedup already makes `slower` false and "
                                                 "`missing` non-empty, so the verdict is partly either way"),
    # core/params.py Params.digest
    "nvfp4study.core.params.xǁParamsǁdigest__mutmut_6": _DUMP,
    "nvfp4study.core.params.xǁParamsǁdigest__mutmut_7": _DUMP,
    "nvfp4study.core.params.xǁParamsǁdigest__mutmut_8": _DUMP,
    # serving/decode_log.py: parse_line's stripping, where the regex or a later strip does the same
    _DL + "x_parse_line__mutmut_3": ("equivalent: rstrip() also strips trailing spaces, which the last value's "
                                     "val.strip() removes anyway"),
    _DL + "x_parse_line__mutmut_4": ("equivalent: a newline left at the end is not matched by LINE_RE's `.*$` "
                                     "(`.` stops at it, `$` matches before it)"),
    _DL + "x_parse_line__mutmut_5": ("equivalent: also strips trailing 'X's; a Decode batch line ends in a number "
                                     "(#queue-req), never in X"),
    _DL + "x_parse_line__mutmut_34": ("equivalent: rpartition for partition: every 'key: value' part of SGLang's line "
                                      "has one ': ' (metrics_reporter.py's format)"),
    _DL + "x_parse_line__mutmut_43": ("equivalent: also strips trailing 'X's from a value; values are numbers and "
                                      "True/False"),
    # codeeval/isolation.py
    _ISO + "x_bwrap_args__mutmut_16": ("equivalent: bwrap reads --cap-drop's ALL case-insensitively (checked: "
                                       "`--cap-drop all` leaves CapEff 0, an unknown name is refused)"),
    _ISO + "x_bwrap_args__mutmut_39": _NO_LIB32,
    _ISO + "x_bwrap_args__mutmut_40": _NO_LIB32,
    _ISO + "x_bwrap_args__mutmut_43": _NO_LIB32,
    _ISO + "x_bwrap_args__mutmut_44": _NO_LIB32,
    _ISO + "x_bwrap_args__mutmut_55": _REAL_DIR,
    _ISO + "x_bwrap_args__mutmut_56": _REAL_DIR,
    _ISO + "x_bwrap_args__mutmut_57": _REAL_DIR,
    _ISO + "x_bwrap_args__mutmut_58": _REAL_DIR,
    _ISO + "x_bwrap_args__mutmut_59": _REAL_DIR,
    _ISO + "x_bwrap_args__mutmut_60": _REAL_DIR,
    # checkpoint/roundtrip.py: sample_experts' early return is a shortcut of the general path
    _RT + "x_sample_experts__mutmut_17": ("equivalent: `and` for `or` in the early return: n <= 0 then gives "
                                          "range(n) = [] below, and no pairs gives pairs[:] = [] (n >= 0 = len)"),
    _RT + "x_sample_experts__mutmut_18": "equivalent: n == 0 no longer returns early but gives range(0) = [] below",
    _RT + "x_sample_experts__mutmut_21": ("equivalent: n == len(pairs) no longer returns pairs early but takes "
                                          "step 1, which picks every pair in order"),
    _RT + "x_sample_experts__mutmut_32": "equivalent: the step when n == 1 is never used (only i = 0 is taken)",
    # sglang/patch_journal.py
    _PJ + "x__write_file__mutmut_7": _CREATE_MODE,
    _PJ + "x__write_file__mutmut_10": _CREATE_MODE,
    _PJ + "x__write_file__mutmut_11": _CREATE_MODE,
    _PJ + "x_write_all__mutmut_53": _INDENT,
    _PJ + "x_write_all__mutmut_55": _INDENT,
    _PJ + "x_write_all__mutmut_58": _INDENT,
}

# --- the modules added after issue 37's first report -------------------------------------------
_CN = "nvfp4study.sglang.clamp_numerics."
_CN_EDGE = ("equivalent on any grid but a contrived one: the comparison differs only at a point whose value equals the "
            "float constant exactly")
_CN_AT_L = "equivalent: at g = L post and pre agree (the gate gap is 0 there), so the maximum over either side is unchanged"
_CN_NONEMPTY = ("equivalent: the grid's g runs from -2 to 3L and a limit is > 0, so both g <= L and g > L are "
                "non-empty and the `else None` is never taken")
_CN_NAN = ("equivalent in the DataFrame compare() returns: a key left out of a row and a None both become NaN in "
           "that float column")

EQUIVALENT.update({
    _CN + "x_compare__mutmut_42": _CN_EDGE + " (|b| == 1e-6)",
    _CN + "x_compare__mutmut_68": _CN_EDGE + " (a gap == 1e-12)",
    _CN + "x_compare__mutmut_76": "equivalent: every column of the ij mesh G holds the same g values (G[:, 1] == G[:, 0])",
    _CN + "x_compare__mutmut_97": _CN_AT_L,
    _CN + "x_compare__mutmut_98": _CN_AT_L,
    _CN + "x_compare__mutmut_112": _CN_NONEMPTY,
    _CN + "x_compare__mutmut_116": _CN_NONEMPTY,
    _CN + "x_compare__mutmut_120": _CN_NONEMPTY,
    _CN + "x_compare__mutmut_135": _CN_NAN,
    _CN + "x_compare__mutmut_136": _CN_NAN,
    _CN + "x_compare__mutmut_137": _CN_NAN,
    _CN + "x_compare__mutmut_138": _CN_NAN,
    _CN + "x_compare__mutmut_139": _CN_NAN,
    _CN + "x_formula_sources__mutmut_23": ("equivalent here: read_text(encoding=None) uses the locale's encoding, "
                                           "UTF-8 on this machine and in the study's containers"),
    _CN + "x_formula_sources__mutmut_25": "equivalent: 'UTF-8' and 'utf-8' name the same codec",
    _CN + "x_grid__mutmut_35": "equivalent: torch.meshgrid's indexing defaults to 'ij' (it warns that it will change)",
    _CN + "x_grid__mutmut_38": "equivalent: torch.meshgrid's indexing defaults to 'ij' (it warns that it will change)",
})

_CS = "nvfp4study.checkpoint.check_scales."
_CS_UNREACHABLE = ("equivalent through audit_checkpoint, check_scales' only caller: modules.py classifies a module whose "
                   "weight_global_scale is not F32 [1] as INVALID-PACKED, never NVFP4, so no module check_scales sees "
                   "has one")
_R01 = "nvfp4study.stages.claim_rules.r01_quantize."
_JSON_DEFAULT = "equivalent: RunPaths.data's ext defaults to 'json'"

EQUIVALENT.update({
    _CS + "x_check_scales__mutmut_16": _CS_UNREACHABLE,
    _CS + "x_check_scales__mutmut_17": _CS_UNREACHABLE,
    _R01 + "xǁQuantizeMeasurementsǁgather__mutmut_28": _JSON_DEFAULT,
    _R01 + "xǁQuantizeMeasurementsǁgather__mutmut_37": _JSON_DEFAULT,
})

_SB = "nvfp4study.codeeval.sandbox."
_SB_POOL = ("equivalent: the serial path and the pool give the same results in the same order (pool.map keeps "
            "it), one check_program per item with the same params; only how many threads run them differs")
_SB_RMTREE = ("equivalent: the folder rmtree removes was made by mkdtemp just before in the same call and nothing "
              "else removes it, so ignore_errors is never needed")

EQUIVALENT.update({
    _SB + "x_check_many__mutmut_1": _SB_POOL,
    _SB + "x_check_many__mutmut_5": _SB_POOL,
    _SB + "x_check_many__mutmut_6": _SB_POOL,
    _SB + "x_check_many__mutmut_7": _SB_POOL,
    _SB + "x_check_many__mutmut_8": _SB_POOL,
    _SB + "x_check_many__mutmut_9": _SB_POOL,
    _SB + "x_check_many__mutmut_16": _SB_POOL,
    _SB + "x__discard__mutmut_4": _SB_RMTREE,
    _SB + "x__discard__mutmut_6": _SB_RMTREE,
    _SB + "x__discard__mutmut_7": _SB_RMTREE,
})

_DT = "nvfp4study.codeeval.detect."
_UTF8 = "equivalent: bytes.decode's encoding defaults to 'utf-8', and 'UTF-8' names the same codec"
EQUIVALENT.update({
    _DT + "x_main__mutmut_3": ("equivalent: prompt '' for None when --prompt is not given: detect_bytes and "
                               "detect_code test the prompt for truth only"),
    _DT + "x_main__mutmut_7": _UTF8,
    _DT + "x_main__mutmut_11": _UTF8,
})
EQUIVALENT.update({
    _DT + "x_detect_bytes__mutmut_24": "equivalent: msg '' for None: only `isinstance(msg, dict)` reads it",
    _DT + "x_detect_bytes__mutmut_30": "equivalent: msg '' for None: only `isinstance(msg, dict)` reads it",
    _DT + "x_detect_bytes__mutmut_69": "equivalent: the pattern is searched with re.I, so </?THINK> matches as </?think>",
    _DT + "x_detect_bytes__mutmut_70": ("equivalent: any kind but 'completion' goes on to detect_code, so the "
                                        "fallback's name is never compared"),
    _DT + "x_detect_bytes__mutmut_71": ("equivalent: any kind but 'completion' goes on to detect_code, so the "
                                        "fallback's name is never compared"),
})
EQUIVALENT.update({
    "nvfp4study.stages.claim_rules.r04_launch.x__control_refusal__mutmut_19": (
        "equivalent but at one point: the miss bound (a Wilson bound to the power n) would have to equal the float "
        "0.05 exactly"),
})
EQUIVALENT.update({
    _DT + "x__checks__mutmut_49": ("equivalent: without an offset `checked` is `code`, so the prompt's slice "
                                   "checked[:0] is empty and counts 0 either way"),
    _DT + "x_detect_code__mutmut_73": ("equivalent: the default first line only has its first character compared "
                                       "with a space or a tab; 'XXXX' is neither, as '' is not"),
    _DT + "x_detect_code__mutmut_79": ("equivalent: a second newline after a prompt that ends in one adds a blank "
                                       "line, which Python and pyflakes skip, and the offset counts it"),
})
EQUIVALENT.update({
    _DT + "x_detect_code__mutmut_82": ("equivalent: a second newline after a prompt that ends in one adds a blank "
                                       "line, which Python and pyflakes skip, and the offset counts it"),
    _DT + "x_detect_code__mutmut_115": ("equivalent: a body is checked inside the prompt + body program, whose "
                                        "module-level names pyflakes already sees; giving them again as scope "
                                        "changes no finding"),
})
EQUIVALENT.update({
    "nvfp4study.stages.claim_rules.r06_mtp.xǁMtpMeasurementsǁspeed_mismatch__mutmut_10": (
        "equivalent for every GPU of workstation/bound.py's table: bw / 1e9 and bw / 1000000001 print the same with "
        ":g (six significant digits)"),
    # mtp_trained_acceptance's zip over the depths and the next depths (strict=True was killed: the lengths differ)
    "nvfp4study.stages.claim_rules.r06_mtp.x_mtp_trained_acceptance__mutmut_41": (
        "equivalent: zip(..., strict=None) checks no lengths, as strict=False (zip reads strict as a truth value)"),
    "nvfp4study.stages.claim_rules.r06_mtp.x_mtp_trained_acceptance__mutmut_44": (
        "equivalent: zip without strict= is strict=False, its default"),
})
EQUIVALENT.update({
    # stages/claim_rules/r03_sglang.py
    "nvfp4study.stages.claim_rules.r03_sglang.x__gap_holds__mutmut_36": (
        "equivalent: rel_tol=1e-9 is math.isclose's default, so leaving it out changes nothing"),
    "nvfp4study.stages.claim_rules.r03_sglang.x__gap_holds__mutmut_48": (
        "equivalent: rel_tol=1e-9 is math.isclose's default, so leaving it out changes nothing"),
    "nvfp4study.stages.claim_rules.r03_sglang.x_clamp_cutlass_fix__mutmut_105": (
        "equivalent: with the `cv is None` branch gone, _form_verdict(None) is contradicted too (neither EXACT "
        "nor APPROX)"),
    # stages/claim_rules/r02_inspect.py
    "nvfp4study.stages.claim_rules.r02_inspect.x_clamp_trtllm_routing__mutmut_38": (
        "equivalent: a missing or zero experts_per_group read as 1 instead of 0 is still not > WARP_SIZE (32)"),
    "nvfp4study.stages.claim_rules.r02_inspect.x_config_clamp_lists__mutmut_23": (
        "equivalent: range(34, 41) adds '40': 5 to the shared list's expected entries, which the '40': 7 after it "
        "overrides in the same dict display"),
})
EQUIVALENT.update({
    _CS + "x_check_scales__mutmut_287": ("equivalent: every routed expert check_scales sees is NVFP4 and so has a "
                                         "weight_global_scale (m.name in wgs always holds); `or` only adds down_proj "
                                         "entries to the pairs, which are never read"),
    _CS + "x_check_scales__mutmut_315": "equivalent: float('NAN') and float('nan') are the same NaN",
    _CS + "x_check_scales__mutmut_319": ("equivalent but at one point: |g - u| would have to equal "
                                         "1e-8 + 1e-5 * |u| exactly in float"),
    _CS + "x_check_scales__mutmut_459": ("equivalent: the branch needs every value equal (len(set(ev)) == 1) and at "
                                         "least two, so ev[1] is ev[0]'s value"),
})
EQUIVALENT.update({
    # stages/claim_rules/r05_corruption.py
    **{_R05 + f"x__trained_note__mutmut_{i}": (
        "equivalent: _trained_note is called only after _trained_refusal has found the exact-bf16 arm, and every "
        "arm row (trained.served.summarize) has its request count, so neither .get default is ever used")
       for i in (3, 5, 15, 17, 20)},
    **{_R05 + f"x_count__mutmut_{i}": "equivalent: a missing cut read as None instead of 0 is made 0 by the `or 0`"
       for i in (59, 61)},
    **{_R05 + f"x_detect_ascii_junk__mutmut_{i}": (
        "equivalent: a junk task with no clean twin read as None instead of False is False to bool()")
       for i in (25, 27)},
    **{_R05 + f"x_detect_method_comparison__mutmut_{i}": (
        "equivalent: the detector's pooled recall then joins the others and is compared with itself (det >= det), "
        "true for any number; it differs only for a NaN recall (no junk variant) with no other method in the "
        "summary, which summarize never writes (the AST and non-ASCII methods always have rows)")
       for i in (29, 30)},
})
