"""The reader of llama.cpp's chat-parser test cases (tests/llamacpp_chat_cases.py), on small C++ snippets written
here: the tokenizer's literals and comments, and the reader's testers, setters, expectations and skips."""

from __future__ import annotations

from tests.llamacpp_chat_cases import Expected, Tool, read_cases, tokenize


def strings(cpp: str) -> list[str]:
    return [t.value for t in tokenize(cpp) if t.kind == "str"]


def line_of(cpp: str, fragment: str) -> int:
    """The 1-based line of cpp that holds fragment."""
    return next(n for n, line in enumerate(cpp.splitlines(), 1) if fragment in line)


def test_escapes():
    assert strings(r'''x = "a\n\t\"\\\'q\?";''') == ["a\n\t\"\\'q?"]
    assert strings(r'"\x41\x7e\101\0z"') == ["A~A\0z"]
    assert strings(r'"\u00e9\U0001F600"') == ["é\U0001F600"]
    assert strings(r'"\xef\xbd\x9c"') == ["｜"]  # UTF-8 bytes read back as one character
    assert strings('"格"') == ["格"]


def test_raw_strings_keep_their_text():
    assert strings('R"(a\\n "b")"') == ['a\\n "b"']
    assert strings('R"#({"code": "print(\\"hi\\")"})#"') == ['{"code": "print(\\"hi\\")"}']
    assert strings('R"xy(a)"b)x")xy"') == ['a)"b)x"']
    assert strings('R"(line1\nline2)" next') == ["line1\nline2"]


def test_adjacent_literals_join():
    tokens = tokenize('f("ab"\n  "cd" R"(ef)", "g");')
    assert [t.value for t in tokens if t.kind == "str"] == ["abcdef", "g"]
    assert [t.line for t in tokens if t.kind == "str"] == [1, 2]


def test_comments_preprocessor_and_lines():
    cpp = '#include "x.h"\n{ /* .name = */ "n", // "gone"\n  /* a\n b */ "d" }\n"/* kept */" \'"\''
    tokens = tokenize(cpp)
    assert [t.value for t in tokens if t.kind == "str"] == ["n", "d", "/* kept */"]
    assert [t.line for t in tokens if t.kind == "str"] == [2, 4, 5]
    assert [t.value for t in tokens if t.kind == "char"] == ['"']
    assert tokens[-1].kind == "eof"


def test_identifiers_join_scopes():
    values = [t.value for t in tokenize("std::string(x) a->b <<= 1.5")]
    assert values == ["std::string", "(", "x", ")", "a", "->", "b", "<<=", "1.5", ""]


PRELUDE = r'''
#include "chat.h"
static common_chat_tool special_function_tool{
    /* .name = */ "special_function",
    /* .description = */ "I'm special",
    /* .parameters = */ R"({"type": "object", "properties": {"arg1": {"type": "integer"}}})",
};

static common_chat_msg simple_assist_msg(const std::string & content,
                                         const std::string & reasoning_content = "",
                                         const std::string & tool_name         = "",
                                         const std::string & arguments         = "",
                                         const std::string & id                = "") {
    common_chat_msg msg;
    msg.content = content;
    return msg;
}

static common_chat_msg message_with_reasoning_content_and_multiple_tool_calls(
    const std::string & reasoning, const std::string & content,
    const std::vector<std::pair<std::string, std::string>> & tool_calls) {
    common_chat_msg msg;
    return msg;
}

const common_chat_msg message_user{ "user", "Hey there!" };
const common_chat_msg message_assist = simple_assist_msg("Hello");
const common_chat_msg message_assist_call = simple_assist_msg("", "", "special_function", "{\"arg1\": 1}");
const common_chat_msg message_id = simple_assist_msg("", "", "f", "{}", /* .id = */ "7");
'''


def test_settings_expectations_and_overrides():
    cpp = PRELUDE + r'''
static void tests(bool detailed_debug) {
    const char * schema = R"({"const": "42"})";
    {
        auto tst = peg_tester("models/templates/A.jinja", detailed_debug);
        const std::string call = "<call>" "1</call>";
        tst.test("I'm\nthinking</think>" + call)
            .reasoning_format(COMMON_REASONING_FORMAT_DEEPSEEK)
            .enable_thinking(false)
            .parallel_tool_calls(true)
            .tool_choice(COMMON_CHAT_TOOL_CHOICE_REQUIRED)
            .tools({ special_function_tool, { /* .name = */ "edit", "Edit", R"({"type": "object"})" } })
            .expect(message_assist_call)
            .expect_content(std::string("after"))
            .expect_reasoning("r")
            .run();
        tst.test("x").expect_tool_calls({ { "g", R"({"a": 1})", {} }, { "h", "{}", "id9" }, })
            .expect(message_assist).json_schema(schema).is_partial(true).expect_reconstruction().run();
        // tst.test("commented out").run();
    }
    {
        auto tst = peg_tester("models/templates/B.jinja");
        tst.test("y")
            .messages({ message_user, message_assist })
            .add_generation_prompt(false)
            .expect(message_with_reasoning_content_and_multiple_tool_calls("think", "c", { { "f", "{}" } }))
            .run();
        tst.test("z").expect(message_id).run();
    }
}
'''
    cases = read_cases(cpp)
    assert [(c.template, c.text) for c in cases] == [
        ("A.jinja", "I'm\nthinking</think><call>1</call>"), ("A.jinja", "x"), ("B.jinja", "y"), ("B.jinja", "z")]
    first, second, third, fourth = cases
    assert first.line == line_of(cpp, 'tst.test("I\'m')
    assert first.reasoning_format == "DEEPSEEK" and first.enable_thinking is False
    assert first.parallel_tool_calls is True and first.tool_choice == "REQUIRED"
    assert first.tools == (Tool("special_function", "I'm special",
                                {"type": "object", "properties": {"arg1": {"type": "integer"}}}),
                           Tool("edit", "Edit", {"type": "object"}))
    # expect() sets the whole message; the later expect_* override their field only
    assert first.expected == Expected("after", "r", (("special_function", '{"arg1": 1}', ""),))
    assert first.json_schema is None and first.is_partial is False and first.other == ()
    # here expect() comes last and replaces the tool calls set before it
    assert second.expected == Expected("Hello")
    assert second.json_schema == '{"const": "42"}' and second.is_partial is True
    assert second.other == ("expect_reconstruction",) and second.reasoning_format is None
    assert third.other == ("messages", "add_generation_prompt")
    assert third.expected == Expected("c", "think", (("f", "{}", ""),))
    assert fourth.expected == Expected(calls=(("f", "{}", "7"),))


def test_tool_calls_with_empty_ids():
    cpp = PRELUDE + r'''
void t() {
    auto tst = peg_tester("models/templates/A.jinja");
    tst.test("x").expect_tool_calls({ { "g", R"({"a": 1})", {} }, { "h", "{}", "id9" }, }).run();
}
'''
    (case,) = read_cases(cpp)
    assert case.expected.calls == (("g", '{"a": 1}', ""), ("h", "{}", "id9"))


def test_skipped_chains_are_reported():
    cpp = PRELUDE + r'''
void t() {
    {
        auto tst = peg_tester("models/templates/A.jinja");
        tst.test("a").expect(message_user).run();
        tst.test("b").expect(unknown_msg).run();
        tst.test("c").expect(message_assist);
        tst.test("d").expect(message_assist).run();
    }
    {
        auto tst = peg_tester(some_path());
        tst.test("e").run();
    }
}
'''
    skipped: list[tuple[int, str]] = []
    cases = read_cases(cpp, skipped=skipped)
    assert [c.text for c in cases] == ["d"]
    lines = [line for line, _ in skipped]
    reasons = [reason for _, reason in skipped]
    assert lines == [line_of(cpp, f'tst.test("{x}")') for x in 'abce']
    assert reasons[0].startswith("A.jinja: message_user: a message written as an initializer list")
    assert reasons[1] == "A.jinja: unknown name unknown_msg"
    assert reasons[2] == "A.jinja: the chain does not end with .run();"
    assert reasons[3].startswith("(unknown template): the tester's template path")


def test_scopes_reuse_a_name_and_a_changed_message_is_skipped():
    cpp = PRELUDE + r'''
void t() {
    {
        auto tst = peg_tester("models/templates/A.jinja");
        auto m = simple_assist_msg("one");
        tst.test("a").expect(m).run();
        m.content = "two";
        tst.test("b").expect(m).run();
    }
    {
        auto tst = peg_tester("models/templates/B.jinja");
        tst.test("c").run();
    }
}
'''
    skipped: list[tuple[int, str]] = []
    cases = read_cases(cpp, skipped=skipped)
    assert [(c.template, c.text, c.expected.content) for c in cases] == [("A.jinja", "a", "one"),
                                                                         ("B.jinja", "c", "")]
    assert len(skipped) == 1 and "changed after its declaration" in skipped[0][1]


def test_loops_helpers_and_template_filter():
    cpp = PRELUDE + r'''
static void shared_cases(const std::string & template_path, bool detailed_debug) {
    auto tst = peg_tester(template_path, detailed_debug);
    tst.test("shared").expect(message_assist).run();
}

static void tests(bool detailed_debug) {
    for (const auto & path : { "models/templates/L1.jinja", "models/templates/L2.jinja" }) {
        auto tst = peg_tester(path, detailed_debug);
        tst.test("looped").run();
    }
    for (const char * tmpl : { "models/templates/H1.jinja", "models/templates/H2.jinja", }) {
        shared_cases(tmpl, detailed_debug);
    }
    for (int i = 0; i < 2; i++) {
        auto tst = peg_tester("models/templates/C.jinja");
        tst.test("counted").run();
    }
}
'''
    cases = read_cases(cpp)
    assert [(c.template, c.text) for c in cases] == [
        ("L1.jinja", "looped"), ("L2.jinja", "looped"), ("H1.jinja", "shared"), ("H2.jinja", "shared"),
        ("C.jinja", "counted")]
    assert cases[2].expected == Expected("Hello")
    filtered = read_cases(cpp, templates={"L2.jinja", "H1.jinja"})
    assert [(c.template, c.text) for c in filtered] == [("L2.jinja", "looped"), ("H1.jinja", "shared")]
