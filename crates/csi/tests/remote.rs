//! The node agent's SnapshotMetadata service over TCP with mutual TLS (`lvms_csi::remote`): a
//! client with a certificate of the same CA reaches the service; one whose certificate another CA
//! signed, or one with no certificate, does not.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{path::Path, sync::Arc, time::Duration};

use lvms_csi::{
    csi::{GetMetadataAllocatedRequest, snapshot_metadata_client::SnapshotMetadataClient},
    remote::{self, SERVER_NAME, Tls},
    snapshot_metadata::SnapshotMetadataService,
};
use lvms_testkit::fake_backend::FakeBackend;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use tonic::Code;

/// A CA and one certificate for [`SERVER_NAME`] it signed, written as a TLS Secret's files.
fn certificates(dir: &Path) {
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let issuer = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec![SERVER_NAME.to_owned()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("ca.crt"), issuer.pem()).unwrap();
    std::fs::write(dir.join("tls.crt"), cert.pem()).unwrap();
    std::fs::write(dir.join("tls.key"), key.serialize_pem()).unwrap();
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn allocated(address: &str, tls: &Tls) -> Result<Code, String> {
    let channel = remote::connect(address, tls)
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    let answer = SnapshotMetadataClient::new(channel)
        .get_metadata_allocated(GetMetadataAllocatedRequest {
            snapshot_id: "snap-x".into(),
            ..GetMetadataAllocatedRequest::default()
        })
        .await;
    Ok(answer.map_or_else(|s| s.code(), |_| Code::Ok))
}

#[tokio::test]
async fn only_a_client_of_the_same_ca_reaches_the_agents_service() {
    let dir = tempfile::tempdir().unwrap();
    let (ours, theirs) = (dir.path().join("ours"), dir.path().join("theirs"));
    certificates(&ours);
    certificates(&theirs);
    let tls = Tls::read(&ours).unwrap();
    let port = free_port();
    let served = tls.clone();
    tokio::spawn(async move {
        remote::serve(
            ([127, 0, 0, 1], port).into(),
            &served,
            SnapshotMetadataService::new(Arc::new(FakeBackend::new())),
            std::future::pending(),
        )
        .await
        .unwrap();
    });
    let address = format!("127.0.0.1:{port}");
    // The in-memory backend has no pools: the service itself answers FAILED_PRECONDITION.
    let mut reached = Err(String::new());
    for _ in 0..50 {
        reached = allocated(&address, &tls).await;
        if reached.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(reached, Ok(Code::FailedPrecondition));

    // Trusting the agent, but with a certificate another CA signed: refused by the agent.
    let mixed = dir.path().join("mixed");
    std::fs::create_dir_all(&mixed).unwrap();
    std::fs::copy(ours.join("ca.crt"), mixed.join("ca.crt")).unwrap();
    std::fs::copy(theirs.join("tls.crt"), mixed.join("tls.crt")).unwrap();
    std::fs::copy(theirs.join("tls.key"), mixed.join("tls.key")).unwrap();
    let stranger = Tls::read(&mixed).unwrap();
    let refused = allocated(&address, &stranger).await;
    assert!(
        !matches!(refused, Ok(Code::FailedPrecondition | Code::Ok)),
        "a client of another CA was served: {refused:?}"
    );
    // An agent whose certificate another CA signed is not trusted by the controller either.
    let port = free_port();
    let impostor = Tls::read(&theirs).unwrap();
    tokio::spawn(async move {
        let _ = remote::serve(
            ([127, 0, 0, 1], port).into(),
            &impostor,
            SnapshotMetadataService::new(Arc::new(FakeBackend::new())),
            std::future::pending(),
        )
        .await;
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let answer = allocated(&format!("127.0.0.1:{port}"), &tls).await;
    assert!(
        !matches!(answer, Ok(Code::FailedPrecondition | Code::Ok)),
        "an agent of another CA was trusted: {answer:?}"
    );
}
