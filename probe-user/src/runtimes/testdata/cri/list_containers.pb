
³
@c1565933b3bb5e5afcb671feee03552d6fbff14809b6d899217f93b2370739dc@50fb0d7ebf82ae124f19f9659c3a9b018d82ffcd3a4ce918ff5d8a07159f9413
worker"
localhost/wp-busybox:test*Gsha256:2d2e1378988bc94b084f9a6aa004d163abe825c21527f6e7849a59111e7565ab08·…ŠÙöB%
io.kubernetes.pod.nameingest-7f9cB=
io.kubernetes.pod.uid$5d1c2a3b-8e4f-4a6b-9c0d-1e2f3a4b5c6dB&
io.kubernetes.container.nameworkerB#
io.kubernetes.pod.namespacedata