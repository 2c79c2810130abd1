/** Builds multipart/form-data bodies byte by byte, for tests that need exact control of them. */
export interface FormPart {
  name: string;
  value: Buffer | string;
  filename?: string;
}

/** The opening of a part: delimiter and headers, up to where its content starts. */
export function partHead(boundary: string, p: Omit<FormPart, 'value'>): Buffer {
  const disp = `form-data; name="${p.name}"${p.filename ? `; filename="${p.filename}"` : ''}`;
  const type = p.filename ? 'content-type: application/octet-stream\r\n' : '';
  return Buffer.from(`--${boundary}\r\ncontent-disposition: ${disp}\r\n${type}\r\n`);
}

/** The closing delimiter, preceded by the CRLF that ends the last part's content. */
export const formEnd = (boundary: string) => Buffer.from(`\r\n--${boundary}--\r\n`);

export function formBody(boundary: string, parts: FormPart[]): Buffer {
  const chunks: Buffer[] = [];
  parts.forEach((p, i) => {
    if (i > 0) chunks.push(Buffer.from('\r\n'));
    chunks.push(partHead(boundary, p), Buffer.from(p.value));
  });
  chunks.push(formEnd(boundary));
  return Buffer.concat(chunks);
}
