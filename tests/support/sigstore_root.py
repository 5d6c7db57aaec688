"""A Sigstore trust root made on the spot, and bundles signed under it, for offline tests.

Every part the sigstore library verifies is real and local: a CA (Fulcio's role) issues
a short-lived code-signing certificate to a workflow identity, with an embedded SCT from
a local CT log key; a local log key (Rekor's role) signs the entry's inclusion promise
and a one-entry checkpoint whose root is that entry's leaf hash. Nothing is faked in the
library: verification runs against `trusted_root.json` as it would against the public one.
"""

from __future__ import annotations

import base64
import hashlib
import json
import struct
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, ExtensionOID, NameOID

__all__ = ["LocalSigstore"]

ISSUER_V2 = x509.ObjectIdentifier("1.3.6.1.4.1.57264.1.8")
START = "2020-01-01T00:00:00Z"
ORIGIN = "rekor.test"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _spki(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _key_id(key: ec.EllipticCurvePrivateKey) -> bytes:
    return hashlib.sha256(_spki(key)).digest()


def _sign(key: ec.EllipticCurvePrivateKey, data: bytes) -> bytes:
    return key.sign(data, ec.ECDSA(hashes.SHA256()))


def _der_length(n: int) -> bytes:
    if n < 0x80:
        return bytes([n])
    body = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([0x80 | len(body)]) + body


def _der_utf8(text: str) -> bytes:
    raw = text.encode()
    return b"\x0c" + _der_length(len(raw)) + raw


def _pae(payload_type: str, payload: bytes) -> bytes:
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def _public_key(key: ec.EllipticCurvePrivateKey) -> dict[str, object]:
    return {
        "rawBytes": _b64(_spki(key)),
        "keyDetails": "PKIX_ECDSA_P256_SHA_256",
        "validFor": {"start": START},
    }


@dataclass
class LocalSigstore:
    """A trust root (CA, CT log and transparency log keys) and a signer under it."""

    ca_key: ec.EllipticCurvePrivateKey
    ca: x509.Certificate
    ct_key: ec.EllipticCurvePrivateKey
    log_key: ec.EllipticCurvePrivateKey

    @classmethod
    def create(cls) -> LocalSigstore:
        ca_key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test sigstore CA")])
        ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
        ca = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(datetime(2020, 1, 1, tzinfo=UTC))
            .not_valid_after(datetime(2040, 1, 1, tzinfo=UTC))
            .add_extension(x509.BasicConstraints(ca=True, path_length=1), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(ski, critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        return cls(
            ca_key=ca_key,
            ca=ca,
            ct_key=ec.generate_private_key(ec.SECP256R1()),
            log_key=ec.generate_private_key(ec.SECP256R1()),
        )

    def trusted_root(self, path: Path) -> Path:
        """Write the trust root as the library reads it (``TrustedRoot.from_file``)."""
        document = {
            "mediaType": "application/vnd.dev.sigstore.trustedroot+json;version=0.1",
            "tlogs": [
                {
                    "baseUrl": f"https://{ORIGIN}",
                    "hashAlgorithm": "SHA2_256",
                    "publicKey": _public_key(self.log_key),
                    "logId": {"keyId": _b64(_key_id(self.log_key))},
                }
            ],
            "certificateAuthorities": [
                {
                    "subject": {"organization": "test", "commonName": "test sigstore CA"},
                    "uri": "https://fulcio.test",
                    "certChain": {
                        "certificates": [
                            {"rawBytes": _b64(self.ca.public_bytes(serialization.Encoding.DER))}
                        ]
                    },
                    "validFor": {"start": START},
                }
            ],
            "ctlogs": [
                {
                    "baseUrl": "https://ct.test",
                    "hashAlgorithm": "SHA2_256",
                    "publicKey": _public_key(self.ct_key),
                    "logId": {"keyId": _b64(_key_id(self.ct_key))},
                }
            ],
            "timestampAuthorities": [],
        }
        path.write_text(json.dumps(document, indent=2))
        return path

    def _certificate(
        self, key: ec.EllipticCurvePrivateKey, identity: str, issuer: str, now: datetime
    ) -> x509.Certificate:
        """A Fulcio-like leaf for *identity*, with an SCT embedded as a CT log gives it."""
        serial = x509.random_serial_number()

        def builder() -> x509.CertificateBuilder:
            return (
                x509.CertificateBuilder()
                .subject_name(x509.Name([]))
                .issuer_name(self.ca.subject)
                .public_key(key.public_key())
                .serial_number(serial)
                .not_valid_before(now - timedelta(minutes=1))
                .not_valid_after(now + timedelta(minutes=10))
                .add_extension(
                    x509.KeyUsage(
                        digital_signature=True,
                        content_commitment=False,
                        key_encipherment=False,
                        data_encipherment=False,
                        key_agreement=False,
                        key_cert_sign=False,
                        crl_sign=False,
                        encipher_only=False,
                        decipher_only=False,
                    ),
                    critical=True,
                )
                .add_extension(
                    x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CODE_SIGNING]), critical=False
                )
                .add_extension(
                    x509.AuthorityKeyIdentifier.from_issuer_public_key(self.ca_key.public_key()),
                    critical=False,
                )
                .add_extension(
                    x509.SubjectAlternativeName([x509.UniformResourceIdentifier(identity)]),
                    critical=True,
                )
                .add_extension(
                    x509.UnrecognizedExtension(ISSUER_V2, _der_utf8(issuer)), critical=False
                )
            )

        precertificate = builder().sign(self.ca_key, hashes.SHA256())
        tbs = precertificate.tbs_certificate_bytes
        stamp = int(now.timestamp()) * 1000
        issuer_key = hashlib.sha256(
            self.ca.public_key().public_bytes(
                serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        ).digest()
        signed = (
            struct.pack("!BBQH", 0, 0, stamp, 1)
            + issuer_key
            + len(tbs).to_bytes(3, "big")
            + tbs
            + struct.pack("!H", 0)
        )
        signature = _sign(self.ct_key, signed)
        sct = (
            struct.pack("!B32sQH", 0, _key_id(self.ct_key), stamp, 0)
            + struct.pack("!BBH", 4, 3, len(signature))
            + signature
        )
        listed = struct.pack("!HH", len(sct) + 2, len(sct)) + sct
        octets = b"\x04" + _der_length(len(listed)) + listed
        sct_extension = x509.UnrecognizedExtension(
            ExtensionOID.PRECERT_SIGNED_CERTIFICATE_TIMESTAMPS, octets
        )
        return (
            builder()
            .add_extension(sct_extension, critical=False)
            .sign(self.ca_key, hashes.SHA256())
        )

    def attest(
        self,
        subjects: dict[str, bytes],
        *,
        identity: str,
        issuer: str = "https://token.actions.githubusercontent.com",
    ) -> bytes:
        """A bundle (JSON) attesting *subjects* (name -> bytes) as *identity* signed them."""
        now = datetime.now(UTC).replace(microsecond=0)
        key = ec.generate_private_key(ec.SECP256R1())
        certificate = self._certificate(key, identity, issuer, now)
        statement = {
            "_type": "https://in-toto.io/Statement/v1",
            "subject": [
                {"name": name, "digest": {"sha256": hashlib.sha256(data).hexdigest()}}
                for name, data in subjects.items()
            ],
            "predicateType": "https://slsa.dev/provenance/v1",
            "predicate": {},
        }
        payload = json.dumps(statement).encode()
        payload_type = "application/vnd.in-toto+json"
        signature = _sign(key, _pae(payload_type, payload))
        envelope = {
            "payload": _b64(payload),
            "payloadType": payload_type,
            "signatures": [{"sig": _b64(signature)}],
        }
        pem = certificate.public_bytes(serialization.Encoding.PEM)
        body = json.dumps(
            {
                "apiVersion": "0.0.1",
                "kind": "dsse",
                "spec": {
                    "envelopeHash": {
                        "algorithm": "sha256",
                        "value": hashlib.sha256(json.dumps(envelope).encode()).hexdigest(),
                    },
                    "payloadHash": {
                        "algorithm": "sha256",
                        "value": hashlib.sha256(payload).hexdigest(),
                    },
                    "signatures": [{"signature": _b64(signature), "verifier": _b64(pem)}],
                },
            },
            sort_keys=True,
            separators=(",", ":"),
        ).encode()
        log_id = _key_id(self.log_key)
        integrated = int(now.timestamp())
        promise = json.dumps(
            {
                "body": _b64(body),
                "integratedTime": integrated,
                "logID": log_id.hex(),
                "logIndex": 0,
            },
            sort_keys=True,
            separators=(",", ":"),
        ).encode()
        root = hashlib.sha256(b"\x00" + body).digest()  # the leaf of a one-entry log
        note = f"{ORIGIN}\n1\n{_b64(root)}\n"
        note_signature = _sign(self.log_key, note.encode())
        checkpoint = f"{note}\n\u2014 {ORIGIN} {_b64(log_id[:4] + note_signature)}\n"
        bundle = {
            "mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json",
            "verificationMaterial": {
                "certificate": {
                    "rawBytes": _b64(certificate.public_bytes(serialization.Encoding.DER))
                },
                "tlogEntries": [
                    {
                        "logIndex": "0",
                        "logId": {"keyId": _b64(log_id)},
                        "kindVersion": {"kind": "dsse", "version": "0.0.1"},
                        "integratedTime": str(integrated),
                        "inclusionPromise": {
                            "signedEntryTimestamp": _b64(_sign(self.log_key, promise))
                        },
                        "inclusionProof": {
                            "logIndex": "0",
                            "rootHash": _b64(root),
                            "treeSize": "1",
                            "hashes": [],
                            "checkpoint": {"envelope": checkpoint},
                        },
                        "canonicalizedBody": _b64(body),
                    }
                ],
            },
            "dsseEnvelope": envelope,
        }
        return json.dumps(bundle, indent=2).encode()
