
¡
@50fb0d7ebf82ae124f19f9659c3a9b018d82ffcd3a4ce918ff5d8a07159f94139
ingest-7f9c$5d1c2a3b-8e4f-4a6b-9c0d-1e2f3a4b5c6ddata €§³ú‰Ùö*
appingest*#
io.kubernetes.pod.namespacedata*%
io.kubernetes.pod.nameingest-7f9c*=
io.kubernetes.pod.uid$5d1c2a3b-8e4f-4a6b-9c0d-1e2f3a4b5c6d