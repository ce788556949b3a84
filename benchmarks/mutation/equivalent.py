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
