"""Native-code attacks of issue 25's first bullet, each a candidate through the real pipeline.

Every payload proves it ran by leaving a marker in a temporary directory (or, for the socket, by
connecting to a listener this test opens on 127.0.0.1). Each attack is tried twice: as it is (the
source check stops it first) and with the source check switched off, so that the binary check of
the compiled library (or the header check of the compile) is what must stop it in the worker."""
from __future__ import annotations

import socket
from pathlib import Path

import pytest

from metal_accel.proof import prove

from harness import kernel_with, markers, run_attack

pytestmark = [pytest.mark.needs_cxx, pytest.mark.slow]

SYSTEM = '(std::system)("touch {m}/{name}");'
CREAT = '#define EXTC extern "C"\nEXTC int creat64(const char*, unsigned);\n'
CTOR_BODY = 'static void ma_at_load() {{ (std::system)("touch {m}/{name}"); }}\n'

# name -> (extra_top, extra_body, includes); {m} is the markers directory, {name} the attack's name
ATTACKS: dict[str, tuple[str, str, str]] = {
    "paren_system": ("", "    " + SYSTEM + "\n", "#include <cstdlib>"),
    "fp_system": ("", '    {{ auto run = &std::system; run("touch {m}/{name}"); }}\n', "#include <cstdlib>"),
    "fp_open": ("", '    {{ int (*f)(const char*, int, ...) = open; f("{m}/{name}", O_CREAT | O_WRONLY, 0644); }}\n',
                "#include <fcntl.h>"),
    "fp_getenv": ("", '    {{ auto g = getenv; if (g("PATH")) ' + SYSTEM + " }}\n", "#include <cstdlib>"),
    "write": ('EXTC long write(int, const void*, unsigned long);\n',
              '    {{ int fd = creat64("{m}/{name}", 0644); write(fd, "x", 1); }}\n', CREAT),
    "gettimeofday": ("", "    {{ timeval t; gettimeofday(&t, 0); if (t.tv_sec > 0) " + SYSTEM + " }}\n",
                     "#include <sys/time.h>\n#include <cstdlib>"),
    "rdtsc": ("", "    if (_rdtsc() > 0) " + SYSTEM + "\n", "#include <x86intrin.h>\n#include <cstdlib>"),
    "environ": ("extern char** environ;\n", "    if (environ && environ[0]) " + SYSTEM + "\n", "#include <cstdlib>"),
    "define_extern_c": (CREAT, '    creat64("{m}/{name}", 0644);\n', ""),
    "include_macro": (CREAT, '    creat64("{m}/{name}", 0644);\n', "#define HDR <cstdio>\n#include HDR"),
    "asm_token_pasting": ("#define CAT(a, b) a##b\n",
                          '    {{ long r; CAT(as, m) volatile("syscall" : "=a"(r) : "a"(85L), "D"("{m}/{name}"), '
                          '"S"(0644L) : "rcx", "r11", "memory"); }}\n', ""),
    "constructor_attribute": ("__attribute__((__constructor__)) " + CTOR_BODY, "", "#include <cstdlib>"),
    "gnu_constructor": ("[[gnu::constructor]] " + CTOR_BODY, "", "#include <cstdlib>"),
    "init_array_pointer": (CTOR_BODY + '__attribute__((section(".init_array"), used)) '
                           "static void (*ma_entry)() = ma_at_load;\n", "", "#include <cstdlib>"),
    "dynamic_initializer": ('static int ma_pwn() {{ return (std::system)("touch {m}/{name}"); }}\n'
                            "const int ma_k = ma_pwn();\n", "", "#include <cstdlib>"),
    "mutable_counter": ("struct MaCounter {{ mutable long n; }};\nconst MaCounter ma_ctr{{0}};\n",
                        "    if (ma_ctr.n++ == 3) " + SYSTEM + "\n", "#include <cstdlib>"),
}


@pytest.fixture(params=["source check", "binary check"])
def stage(request, monkeypatch) -> str:
    """Which layer must stop the attack: with "binary check" the source check is switched off."""
    if request.param == "binary check":
        monkeypatch.setattr(prove, "check_kernel_source", lambda source, language: None)
    return request.param


def _reasons(report) -> str:
    return " | ".join([report.reason, *report.rejected])


def _assert_stopped(report, stage: str, marker_dir: Path) -> None:
    assert report.status == "eager", report
    expected = ("source check",) if stage == "source check" else ("binary check", "header check", "compile")
    assert any(e in _reasons(report) for e in expected), _reasons(report)
    assert markers(marker_dir) == []


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_native_attack_is_stopped(tmp_path, stage, name):
    m = tmp_path / "markers"
    m.mkdir()
    top, body, includes = (part.format(m=m, name=name) for part in ATTACKS[name])
    report = run_attack(tmp_path, kernel_with(extra_top=top, extra_body=body, includes=includes))
    _assert_stopped(report, stage, m)
    if stage == "binary check":
        assert "binary check" in _reasons(report) or "header check" in _reasons(report), _reasons(report)


def test_socket_to_local_listener_gets_no_connection(tmp_path, stage):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    body = (f"    {{ auto mk = &socket; int fd = mk(2, 1, 0); sockaddr_in a{{}}; a.sin_family = 2; "
            f"a.sin_port = htons({port}); a.sin_addr.s_addr = htonl(0x7f000001); "
            "connect(fd, (sockaddr*)&a, sizeof a); send(fd, \"sk-fake-key\", 11, 0); }\n")
    try:
        report = run_attack(tmp_path, kernel_with(extra_body=body, includes="#include <sys/socket.h>\n"
                                                  "#include <netinet/in.h>\n#include <arpa/inet.h>"))
        with pytest.raises(socket.timeout):
            listener.accept()
    finally:
        listener.close()
    _assert_stopped(report, stage, tmp_path / "markers")


@pytest.mark.parametrize("how", ["relative", "absolute"])
def test_include_outside_never_quotes_the_file(tmp_path, stage, how):
    from metal_accel.core import config
    secret = config.user_cache_dir() / "secret.h"  # three levels above the compile's scratch directory
    secret.parent.mkdir(parents=True, exist_ok=True)
    secret.write_text("API_KEY = sk-secret-31337;\nint leaked_from_home() { return 1; }\n")
    path = "../../../secret.h" if how == "relative" else str(secret)
    report = run_attack(tmp_path, kernel_with(includes=f'#include "{path}"'))
    _assert_stopped(report, stage, tmp_path / "markers")
    reasons = _reasons(report)
    assert "sk-secret" not in reasons and "API_KEY" not in reasons and "leaked_from_home" not in reasons, reasons
