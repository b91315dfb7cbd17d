/*
 * defsig: the signature of a VM definition that the control plane sends
 * with vm.start (agent-protocol §4.9).  A libvirt domain XML can name any
 * disk, device or emulator of the host, so the agent defines one from the
 * wire only when the control plane's definition-signing key signed it:
 * Ed25519 over
 *
 *     "cutpoint-vm-definition/1" NUL <vm name> NUL <the XML's exact bytes>
 *
 * so that one signature starts one VM with one definition (a signature
 * made for VM a does not start VM b with the same XML).  The public key is
 * a PEM file ([libvirt] definition_key); the private key never leaves the
 * control plane.  Pure crypto (OpenSSL EVP_DigestVerify), no libvirt.
 */
#ifndef CP_DEFSIG_H
#define CP_DEFSIG_H

#include <stddef.h>

#define DEFSIG_CONTEXT "cutpoint-vm-definition/1"

/*
 * 0 when sig_b64 (base64 of the 64-byte Ed25519 signature) is the
 * signature, by the key in the PEM file keypath, of vm and len bytes of
 * xml.  -1 with why otherwise: no key configured (keypath ""), the key
 * unreadable or not Ed25519, sig not base64 of 64 bytes, or it does not
 * verify.
 */
int defsig_verify(const char *keypath, const char *vm, const char *xml,
                  size_t len, const char *sig_b64, char *why, size_t whylen);

#endif
