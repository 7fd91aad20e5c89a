//! The reader against our own two Dockerfiles (so the images built here follow them) and against
//! what it must refuse.

use super::*;

const CONTROLLER: &str = include_str!("../../../controller/Dockerfile");
const AGENT: &str = include_str!("../../../agent/Dockerfile");

fn strings(words: &[&str]) -> Vec<String> {
    words.iter().map(|&w| w.to_owned()).collect()
}

#[test]
fn the_controllers_dockerfile_reads_as_a_static_nonroot_image_running_the_controller() {
    let spec = parse(CONTROLLER, "amd64").unwrap();
    assert_eq!(
        spec,
        ImageSpec {
            base: "gcr.io/distroless/static-debian12:nonroot".into(),
            env: Vec::new(),
            copies: vec![(
                "amd64/gpu-remediator".into(),
                "/usr/local/bin/gpu-remediator".into()
            )],
            user: Some("65532:65532".into()),
            exposed: strings(&["8080/tcp"]),
            entrypoint: strings(&["/usr/local/bin/gpu-remediator"]),
            cmd: strings(&["run"]),
        }
    );
    assert_eq!(spec.base_kind(), Ok(Base::Static));
}

#[test]
fn the_agents_dockerfile_reads_per_architecture_with_its_stages_library_path() {
    for (arch, library) in [
        ("amd64", "/host/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"),
        ("arm64", "/host/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1"),
    ] {
        let spec = parse(AGENT, arch).unwrap();
        assert_eq!(spec.base, "gcr.io/distroless/cc-debian12:nonroot", "{arch}");
        assert_eq!(spec.env, [format!("NVML_LIBRARY={library}")], "{arch}");
        assert_eq!(
            spec.copies,
            [(
                format!("{arch}/gpu-health-agent"),
                "/usr/local/bin/gpu-health-agent".to_owned()
            )]
        );
        assert_eq!(spec.user.as_deref(), Some("65532:65532"));
        assert_eq!(spec.entrypoint, strings(&["/usr/local/bin/gpu-health-agent"]));
        assert!(spec.cmd.is_empty());
        assert_eq!(spec.base_kind(), Ok(Base::Cc));
    }
}

#[test]
fn an_instruction_the_builder_does_not_follow_is_refused_with_its_line() {
    let dockerfile = "FROM gcr.io/distroless/static-debian12:nonroot\nRUN apt-get install -y curl\n";
    assert_eq!(
        parse(dockerfile, "amd64"),
        Err(DockerfileError::Unknown {
            line: 2,
            instruction: "RUN".into()
        })
    );
    let shell_form = "FROM gcr.io/distroless/static-debian12:nonroot\nENTRYPOINT /bin/app run\n";
    assert!(matches!(
        parse(shell_form, "amd64"),
        Err(DockerfileError::Malformed { line: 2, .. })
    ));
    let other_base = parse("FROM debian:12\n", "amd64").unwrap();
    assert!(matches!(
        other_base.base_kind(),
        Err(DockerfileError::UnknownBase(_))
    ));
}

#[test]
fn ldd_names_the_loader_and_each_resolved_library_and_a_missing_one_fails() {
    let output = "\tlinux-vdso.so.1 (0x00007ffd6b1e2000)
\tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f0c4a1b0000)
\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f0c49fcf000)
\t/lib64/ld-linux-x86-64.so.2 (0x00007f0c4a8f6000)
";
    assert_eq!(
        libraries_from_ldd(output),
        Some(strings(&[
            "/lib/x86_64-linux-gnu/libgcc_s.so.1",
            "/lib/x86_64-linux-gnu/libc.so.6",
            "/lib64/ld-linux-x86-64.so.2",
        ]))
    );
    assert_eq!(libraries_from_ldd("\tstatically linked\n"), Some(Vec::new()));
    assert_eq!(libraries_from_ldd("\tlibfoo.so.1 => not found\n"), None);
}
